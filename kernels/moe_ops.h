// Device-dispatching entry points of the mixture-of-experts kernels (Mixtral, Qwen2-MoE,
// Qwen3-MoE): the router, its auxiliary losses, token dispatch and combine, and the experts'
// grouped projections. The same contract as kernels/ops.h: stream-ordered and asynchronous on
// ctx.stream(), device buffers, CPU twins in kernels/cpu/ (moe_router.h, moe_permute.h,
// grouped_linear.h: they define the math) and CUDA twins in kernels/cuda/.
//
// One MoE layer of N tokens, C channels, E experts, top-k, in order (SwiGLU experts as the
// models compose them):
//   logits (N,E)  = linear_forward(x, router weight (E,C))           [kernels/ops.h]
//   moe_router_forward            -> probs (N,E) fp32, weights (N,k) fp32, experts (N,k) int32
//   moe_dispatch_plan             -> counts (E), offsets (E+1), row_of (N,k), source (N*k)
//   copy counts (or offsets) to the host: the grouped linears need them there, and so does an
//     all-to-all of expert parallelism (the one host synchronisation of the layer)
//   moe_gather x -> xe (N*k rows, C); grouped_linear_forward gate, up -> (N*k rows, I);
//   swiglu_forward; grouped_linear_forward down -> y (N*k rows, C); moe_combine y -> out (N,C)
// and the backward in reverse, with moe_aux_stats_accumulate / moe_load_balancing_loss[_backward]
// once per step over the layers and the loss's dprobs_shared passed to every layer's
// moe_router_backward.
//
// Types: router statistics (probs, weights, their gradients, the losses, the load-balancing
// statistics) are fp32; expert indices and the dispatch plan int32. `dtype` is the storage of
// activations and weights (fp32, bf16, fp16; 16-bit storage computes in fp32); the router logits
// and their gradient are of `dtype` as the gate's linear writes them (transformers' router casts
// them to fp32 before the softmax: so does this). Row buffers indexed by the dispatch plan (xe,
// y, their gradients) have N*k rows: the rows dispatched, R = offsets[E], are known on the device
// before the host, so a caller that does not wait for the counts allocates the most there can be.
// Every sum runs in a fixed order: each op gives the same bits on every run (no atomics).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/grad_write.h"
#include "kernels/kernel_context.h"
#include "kernels/moe_limits.h"
#include "kernels/ops.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device_ptr.h"

namespace zrt::kernels {

using Ints = DevicePtr<std::int32_t>;
using ConstInts = DevicePtr<const std::int32_t>;

// ---- Router (kernels/cpu/moe_router.h) ----

// probs (N,E) = softmax(logits (N,E) of `dtype`) in fp32; experts (N,k) the k most probable,
// most probable first, the lower expert index first among equal probabilities; weights (N,k)
// their probabilities, divided by their sum when `renormalize` (Mixtral always; Qwen2/3-MoE with
// norm_topk_prob). 1 <= k <= min(E, kMoeMaxTopK). All three OVERWRITTEN.
void moe_router_forward(KernelContext& ctx, DType dtype, Floats probs, Floats weights, Ints experts,
                        ConstBytes logits, int N, int E, int k, bool renormalize);
// dlogits (N,E) of `dtype` += (= with kOverwrite) the gradient through the softmax of: dweights
// (N,k) through the top-k weights (and their renormalisation), null for none; plus dprobs_shared
// (E), a gradient of every row's probs alike (moe_load_balancing_loss_backward's), null for none.
void moe_router_backward(KernelContext& ctx, DType dtype, Bytes dlogits, ConstFloats dweights,
                         ConstFloats probs, ConstInts experts, ConstFloats dprobs_shared, int N,
                         int E, int k, bool renormalize,
                         GradWrite dlogits_write = GradWrite::kAccumulate);

// ---- Load-balancing loss (transformers' load_balancing_loss_func, no attention mask) ----

// One layer's statistics: counts (E) += the (row, slot) pairs choosing each expert (each of the
// k slots counts one), probsum (E) += the column sums of probs (N,E). Zero both once, then call
// it for each of the L MoE layers of the forward.
void moe_aux_stats_accumulate(KernelContext& ctx, Floats counts, Floats probsum, ConstFloats probs,
                              ConstInts experts, int N, int E, int k);
// loss[0] = E * sum_e (counts[e] / T) * (probsum[e] / T), T = total_rows = L*N (OVERWRITTEN).
// The models scale it by router_aux_loss_coef.
void moe_load_balancing_loss(KernelContext& ctx, Floats loss, ConstFloats counts,
                             ConstFloats probsum, int E, std::int64_t total_rows);
// dprobs_shared (E) = dloss * E * counts[e] / T^2 (OVERWRITTEN): d loss / d probs[n,e] for every
// row n of every layer, for each layer's moe_router_backward.
void moe_load_balancing_loss_backward(KernelContext& ctx, Floats dprobs_shared, ConstFloats counts,
                                      float dloss, int E, std::int64_t total_rows);

// loss[0] += coef * term[0]: an auxiliary loss (load balancing, z-loss) added to the training
// loss on the device.
void moe_add_loss_term(KernelContext& ctx, Floats loss, ConstFloats term, float coef);

// ---- Router z-loss (ST-MoE) ----

// loss[0] = mean over the N rows of logsumexp(logits[n])^2 (OVERWRITTEN; the sum in double).
void moe_router_z_loss_forward(KernelContext& ctx, DType dtype, Floats loss, ConstBytes logits,
                               int N, int E);
// dlogits (N,E) += dloss * 2 * lse_n * softmax(logits[n]) / N.
void moe_router_z_loss_backward(KernelContext& ctx, DType dtype, Bytes dlogits, ConstBytes logits,
                                float dloss, int N, int E);

// ---- Dispatch and combine (kernels/cpu/moe_permute.h) ----

// The stable sort of the N*k (token, slot) pairs p = n*k+j by expert: counts (E), offsets (E+1)
// (offsets[E] = R, the pairs dispatched), row_of (N,k) each pair's row (-1 for a slot whose
// expert is < 0: routed nowhere), source (N*k) the pair of each row r < R. All OVERWRITTEN
// (source from R on untouched). Expert indices must be < E (the CPU twin throws, the CUDA twin
// relies on it).
void moe_dispatch_plan(KernelContext& ctx, Ints counts, Ints offsets, Ints row_of, Ints source,
                       ConstInts experts, int N, int k, int E);
// xe (N*k rows, C): row row_of[n,j] = x[n] (N,C), for every pair dispatched.
void moe_gather(KernelContext& ctx, DType dtype, Bytes xe, ConstBytes x, ConstInts row_of, int N,
                int k, int C);
// dx (N,C) += sum over j in slot order of dxe[row_of[n,j]].
void moe_gather_backward(KernelContext& ctx, DType dtype, Bytes dx, ConstBytes dxe,
                         ConstInts row_of, int N, int k, int C);
// out (N,C) = sum over j in slot order of weights[n,j] * y[row_of[n,j]] (OVERWRITTEN; zero for a
// token routed nowhere). y (N*k rows, C), weights (N,k) fp32.
void moe_combine(KernelContext& ctx, DType dtype, Bytes out, ConstBytes y, ConstFloats weights,
                 ConstInts row_of, int N, int k, int C);
// dy[row_of[n,j]] = weights[n,j] * dout[n] (OVERWRITES the R dispatched rows of dy (N*k rows, C));
// dweights[n,j] = dot(dout[n], y[row_of[n,j]]) fp32, 0 for a slot routed nowhere (OVERWRITTEN).
void moe_combine_backward(KernelContext& ctx, DType dtype, Bytes dy, Floats dweights,
                          ConstBytes dout, ConstBytes y, ConstFloats weights, ConstInts row_of,
                          int N, int k, int C);

// ---- Grouped linear (kernels/cpu/grouped_linear.h) ----

// out[rows of e] (OC) = inp[rows of e] (IC) @ weight[e]^T for weight (E,OC,IC), expert e owning
// rows [offsets[e], offsets[e+1]) (`offsets`: E+1 non-decreasing host values, moe_dispatch_plan's
// copied back). OVERWRITES those rows of out. CPU: linear_forward per expert; CUDA: one cuBLAS
// GEMM per expert with rows (on the stream, no synchronisation). weight_stride (elements, 0:
// OC*IC) spaces the experts' weights: transformers v5's fused gate_up_proj (E,2I,C) gives the gate
// projection at its start and the up projection at + I*C, each with OC = I and stride 2I*C
// (kernels/cpu/grouped_linear.h); dweight the same.
void grouped_linear_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp,
                            ConstBytes weight, const std::vector<std::int32_t>& offsets, int E,
                            int IC, int OC, std::int64_t weight_stride = 0);
// dinp[rows of e] += dout[rows of e] @ weight[e] (= with kOverwrite; dinp may be null);
// dweight (E,OC,IC) of grad_dtype += dout[rows of e]^T @ inp[rows of e] (dweight may be null: a
// frozen weight, its GEMMs skipped). An expert without rows is skipped: its dweight keeps its
// value.
void grouped_linear_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp,
                             Bytes dweight, ConstBytes dout, ConstBytes inp, ConstBytes weight,
                             const std::vector<std::int32_t>& offsets, int E, int IC, int OC,
                             GradWrite dinp_write = GradWrite::kAccumulate,
                             std::int64_t weight_stride = 0);

// ---- Qwen2-MoE's shared expert (kernels/cpu/moe_shared_gate.h) ----

// out (N,C) += sigmoid(g[n]) * s[n] for s (N,C) the shared expert's output and g (N) its gate's
// logit (the (N,1) output of shared_expert_gate), all of `dtype`.
void moe_shared_gate_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes s, ConstBytes g,
                             int N, int C);
// ds (N,C) = sigmoid(g[n]) * dout[n]; dg (N) = sigmoid'(g[n]) * dot(dout[n], s[n]) (both
// OVERWRITTEN).
void moe_shared_gate_backward(KernelContext& ctx, DType dtype, Bytes ds, Bytes dg, ConstBytes dout,
                              ConstBytes s, ConstBytes g, int N, int C);

}  // namespace zrt::kernels
