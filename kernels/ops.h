// Device-dispatching entry points of the transformer kernels: what models call.
//
// Every op is stream-ordered and asynchronous: it is enqueued on ctx.stream() and returns at
// once (the CPU backend runs the CPU twin in kernels/cpu/ on the stream's worker thread; the
// CUDA backend launches the CUDA twin in kernels/cuda/ on the CUDA stream). Buffers are device
// memory (DevicePtr); their contents must stay valid until the op has run.
//
// Types: `dtype` is the storage type of activations and parameters (fp32, bf16 or fp16; 16-bit
// storage computes in fp32). `grad_dtype` is the type of parameter gradients: dtype or fp32.
// Statistics (LayerNorm mean/rstd, attention log-sum-exp, losses) are always fp32.
// Parameter and input gradients ACCUMULATE (+=) unless an op says otherwise; the caller zeroes
// them. matmul_backward and linear_backward OVERWRITE dinp with GradWrite::kOverwrite (its one
// producer: no zeroing, and on CUDA no read of the zeros; kernels/grad_write.h). Shapes follow the
// CPU twins' headers (kernels/cpu/<layer>.h), which define the math.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/grad_write.h"
#include "kernels/kernel_context.h"
#include "kernels/rope_table.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device_ptr.h"

namespace zrt::kernels {

using Bytes = DevicePtr<std::byte>;
using ConstBytes = DevicePtr<const std::byte>;
using Floats = DevicePtr<float>;
using ConstFloats = DevicePtr<const float>;
using ConstTokens = DevicePtr<const std::int32_t>;

// Throws InvalidArgument unless (dtype, grad_dtype) is a supported pair: (fp32, fp32),
// (bf16, bf16|fp32), (fp16, fp16|fp32).
void check_dtypes(DType dtype, DType grad_dtype);

// Packed documents. A micro-batch (B,T) may pack several documents into each sequence; the ops
// that see positions take them as:
//   doc_start (B,T) int32: for token t of sequence b, the index within sequence b of the first
//       token of t's document: 0 <= doc_start[t] <= t, and doc_start[t] is doc_start[t-1] or t.
//       Attention lets query t see keys [doc_start[t], t] only.
//   positions (B,T) int32: t - doc_start[t], each token's position within its document.
// Sliding window (attention only): `window` W > 0 also hides the keys before t - W + 1 from query
// t (W keys at most, t itself included), as transformers' sliding_window mask (Mistral; Qwen2's
// layers from max_window_layers on): query t sees [max(doc_start[t], t - W + 1), t]. 0 (the
// default) or W >= T is none, the unwindowed op bit for bit; negative throws InvalidArgument.
// Null (the default) is one document per sequence, positions 0..T-1: the unpacked ops, bit for
// bit. Targets < 0 (crossentropy_*) are tokens left out of the loss. The CPU twins throw
// InvalidArgument on a doc_start that is no packing and on positions outside [0,P) where they
// index wpe; the CUDA twins rely on the contract unchecked, as they do for token ids.

// out (B,T,C) = wte[tokens] + wpe[pos].   tokens (B,T) in [0,V); pos = positions[b*T+t] in
// [0,P), or t with positions null; P = position_rows, the rows of wpe (0: T; a sequence-parallel
// chunk's positions run past its T). wpe/dwpe may be null (no position embedding: the Llama
// family).
void encoder_forward(KernelContext& ctx, DType dtype, Bytes out, ConstTokens tokens, ConstBytes wte,
                     ConstBytes wpe, int B, int T, int C, int V, ConstTokens positions = {},
                     int position_rows = 0);
// dwte (V,C) += per-token sums of dout; dwpe (P,C) += per-position sums (over b without
// positions). Either may be null (no position embedding; a frozen table: not computed).
void encoder_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dwte, Bytes dwpe,
                      ConstBytes dout, ConstTokens tokens, int B, int T, int C, int V,
                      ConstTokens positions = {}, int position_rows = 0);

// out (N,C), mean/rstd (N) fp32. In layernorm_backward dweight and dbias may each be null
// (a frozen weight or bias, ParamAccess::trains): that column sum is not computed.
void layernorm_forward(KernelContext& ctx, DType dtype, Bytes out, Floats mean, Floats rstd,
                       ConstBytes inp, ConstBytes weight, ConstBytes bias, int N, int C);
void layernorm_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp,
                        Bytes dweight, Bytes dbias, ConstBytes dout, ConstBytes inp,
                        ConstBytes weight, ConstFloats mean, ConstFloats rstd, int N, int C);
// res (N,C) = a + b, then out, mean, rstd = layernorm(res): residual_forward then
// layernorm_forward, in one pass over each row on CUDA where the row fits its registers.
void residual_layernorm_forward(KernelContext& ctx, DType dtype, Bytes res, Bytes out, Floats mean,
                                Floats rstd, ConstBytes a, ConstBytes b, ConstBytes weight,
                                ConstBytes bias, int N, int C);

// out (N,OC) = inp (N,C) @ weight (C,OC) + bias (OC) (Conv1D layout; bias may be null). In
// matmul_backward and linear_backward dinp, dweight and dbias may each be null: that gradient
// is not computed (a null dweight skips its GEMM: a frozen weight, ParamAccess::trains).
void matmul_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp, ConstBytes weight,
                    ConstBytes bias, int N, int C, int OC);
void matmul_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dweight,
                     Bytes dbias, ConstBytes dout, ConstBytes inp, ConstBytes weight, int N, int C,
                     int OC, GradWrite dinp_write = GradWrite::kAccumulate);

void gelu_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp, std::int64_t n);
void gelu_backward(KernelContext& ctx, DType dtype, Bytes dinp, ConstBytes inp, ConstBytes dout,
                   std::int64_t n);

// The MLP's GELU with its GEMMs (kernels/cuda/matmul_gelu.cuh): on CUDA, cuBLASLt epilogues where
// cuBLASLt has them, else, as on the CPU, exactly the composition of the ops above.
// pre (N,OC) = inp @ weight + bias; out = gelu(pre): matmul_forward then gelu_forward.
void matmul_gelu_forward(KernelContext& ctx, DType dtype, Bytes out, Bytes pre, ConstBytes inp,
                         ConstBytes weight, ConstBytes bias, int N, int C, int OC);
// For act = gelu(pre) (N,C) feeding matmul(act, weight (C,OC), bias): dpre = gelu'(pre) *
// (dout @ weight^T), OVERWRITTEN; dweight and dbias accumulate as matmul_backward's (a null
// dweight skips its GEMM: a frozen weight). `scratch`
// (N,C) takes dout @ weight^T where the two are not fused: matmul_backward into scratch
// (kOverwrite), then gelu_backward into dpre from zero.
void matmul_dgelu_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dpre,
                           Bytes scratch, Bytes dweight, Bytes dbias, ConstBytes dout,
                           ConstBytes act, ConstBytes weight, ConstBytes pre, int N, int C, int OC);

void residual_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes a, ConstBytes b,
                      std::int64_t n);
void residual_backward(KernelContext& ctx, DType dtype, Bytes da, Bytes db, ConstBytes dout,
                       std::int64_t n);

// Causal self-attention: out (B,T,C), qkv (B,T,3C), lse (B,NH,T) fp32: each query row's
// log-sum-exp of its scores, the only statistic kept for the backward, which recomputes the
// probabilities (FlashAttention's scheme; kernels/cpu/attention.h). The backward also reads the
// forward's `out`. On CUDA, bf16/fp16 with head size 64 or 128 and T a multiple of 64 run the
// fused tensor-core kernels (kernels/cuda/flash_attention.cuh); other shapes the batched-GEMM
// path. With doc_start (packed documents, above) query t attends keys [doc_start[t], t]; the
// CPU twin and the fused kernels skip the work outside the documents (a packed step costs about
// its documents' attention), the batched path masks it; a sliding `window` (above) likewise,
// the CPU's tiled path and the fused kernels skipping the key tiles before it (cuDNN's attention,
// where asked for, takes it as its diagonal band's left bound; packed documents it is not asked
// for). Both passes take the same doc_start and window.
void attention_forward(KernelContext& ctx, DType dtype, Bytes out, Floats lse, ConstBytes qkv,
                       int B, int T, int C, int NH, ConstTokens doc_start = {}, int window = 0);
// dqkv_write: kAccumulate (the contract above); kIntoZeros, the caller's promise that dqkv holds
// zeros (the models' driver zeroes it before each block's backward), which lets cuDNN's
// attention write the gradients straight into it instead of through workspace and an add (the
// CPU backend throws when the promise is broken); or kOverwrite, for a dqkv whose only producer
// this is: cuDNN's writes it in place, zrt's kernels and the CPU twin zero it first.
void attention_backward(KernelContext& ctx, DType dtype, Bytes dqkv, ConstBytes dout,
                        ConstBytes qkv, ConstBytes out, ConstFloats lse, int B, int T, int C,
                        int NH, ConstTokens doc_start = {}, int window = 0,
                        GradWrite dqkv_write = GradWrite::kAccumulate);

// The head. `row_stride` is the logits' row stride in elements (0: dense rows of V). The
// models pass logits_row_stride(V): V rounded up to a multiple of 128, so every row starts
// aligned and cuBLAS picks its aligned tensor-core kernels (rows of GPT-2's odd 50257 force
// its align1 fallbacks; the CUDA head's forward also runs its GEMM over the padded vocabulary:
// wte's first V rounded down to 8 rows read in place, its last rows and the zero ones from a small
// copy). Columns V..row_stride never reach a loss or a weight: logits_forward may write anything
// there, crossentropy_backward writes zeros.
int logits_row_stride(int V);

// logits (N,V) = inp (N,C) @ wte^T (V,C): the tied GPT-2 head. logits_backward's dwte may be
// null (a head that is not trained): its GEMM is skipped.
void logits_forward(KernelContext& ctx, DType dtype, Bytes logits, ConstBytes inp, ConstBytes wte,
                    int N, int C, int V, int row_stride = 0);
void logits_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dwte,
                     ConstBytes dlogits, ConstBytes inp, ConstBytes wte, int N, int C, int V,
                     int row_stride = 0);
// losses (N) fp32. A row whose target is < 0 is not in the loss: loss 0, and in the two ops below
// an all-zero dlogits row.
void crossentropy_forward(KernelContext& ctx, DType dtype, Floats losses, ConstBytes logits,
                          ConstTokens targets, int N, int V, int row_stride = 0);
// dlogits = (softmax(logits) - onehot) * dloss; OVERWRITES dlogits, which may equal logits.
void crossentropy_backward(KernelContext& ctx, DType dtype, Bytes dlogits, ConstBytes logits,
                           ConstTokens targets, float dloss, int N, int V, int row_stride = 0);
// The fused classifier of a training step: crossentropy_forward's losses and
// crossentropy_backward's dlogits from one computation of each row's statistics, bit for bit
// what the two ops give. The logits are the largest tensor of a step (N x 50304 for GPT-2), and
// the two ops read them three times; this reads them twice (the second read right after the
// first, per row) and writes them once. dlogits may equal logits.
void crossentropy_forward_backward(KernelContext& ctx, DType dtype, Floats losses, Bytes dlogits,
                                   ConstBytes logits, ConstTokens targets, float dloss, int N,
                                   int V, int row_stride = 0);
// out[0] = sum of losses[0..N) (in double, in a fixed order) / (divisor > 0 ? divisor : N). With
// masked targets the divisor is the count of loss tokens (of the global batch, so gradients do not
// change with micro-batching); 0 is the mean, bit for bit as before the divisor existed.
void loss_mean(KernelContext& ctx, Floats out, ConstFloats losses, int N, float divisor = 0.0f);

// ---- The Llama family (Llama, Qwen2, Mistral) ----

// out (N,C) = inp * rstd * weight, rstd (N) fp32 (kernels/cpu/rmsnorm.h). rmsnorm_backward's
// dweight may be null (a frozen weight): its column sums are not computed.
void rmsnorm_forward(KernelContext& ctx, DType dtype, Bytes out, Floats rstd, ConstBytes inp,
                     ConstBytes weight, int N, int C, double eps);
void rmsnorm_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dweight,
                      ConstBytes dout, ConstBytes inp, ConstBytes weight, ConstFloats rstd, int N,
                      int C);
// res (N,C) = a + b, then out, rstd = rmsnorm(res): residual_forward then rmsnorm_forward, in
// one pass over each row on CUDA where the row fits its registers (16-bit, C % 8 == 0, C <= 4096).
void residual_rmsnorm_forward(KernelContext& ctx, DType dtype, Bytes res, Bytes out, Floats rstd,
                              ConstBytes a, ConstBytes b, ConstBytes weight, int N, int C,
                              double eps);

// out (N,OC) = inp (N,C) @ weight^T + bias, weight (OC,C) as nn.Linear (bias may be null).
void linear_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp, ConstBytes weight,
                    ConstBytes bias, int N, int C, int OC);
void linear_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dweight,
                     Bytes dbias, ConstBytes dout, ConstBytes inp, ConstBytes weight, int N, int C,
                     int OC, GradWrite dinp_write = GradWrite::kAccumulate);

// Rotary embeddings of x (B,T,NH,hs) (kernels/cpu/rope.h): token (b,t) rotated by its position,
// positions[b*T+t] (packed documents), or t with positions null. Both OVERWRITE `out`/`dinp`,
// which may equal the input (in place).
void rope_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp,
                  const RopeTable& table, int B, int T, int NH, int hs, ConstTokens positions = {});
void rope_backward(KernelContext& ctx, DType dtype, Bytes dinp, ConstBytes dout,
                   const RopeTable& table, int B, int T, int NH, int hs,
                   ConstTokens positions = {});

// out = silu(gate) * up over n elements; dgate, dup accumulate.
void swiglu_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes gate, ConstBytes up,
                    std::int64_t n);
void swiglu_backward(KernelContext& ctx, DType dtype, Bytes dgate, Bytes dup, ConstBytes dout,
                     ConstBytes gate, ConstBytes up, std::int64_t n);

// Causal grouped-query attention: q, out (B,T,NH,hs); k, v (B,T,NKV,hs); lse (B,NH,T) fp32, each
// query row's log-sum-exp, the only statistic kept for the backward (attention's contract above;
// kernels/cpu/gqa_attention.h). Where a backend's flash-style kernels take the shape (the CPU's
// tiled path with fp32/fp64 storage; CUDA's fused kernels: bf16/fp16, head size 64 or 128, T a
// multiple of 64) they read q, k, v in place, query head h reading key/value head h / group;
// otherwise q and the repeated k, v heads are packed into attention's (B,T,3C) layout and it
// runs on that. doc_start and window as attention's. The backward also reads the forward's `out`
// and adds to dq, dk, dv.
void gqa_attention_forward(KernelContext& ctx, DType dtype, Bytes out, Floats lse, ConstBytes q,
                           ConstBytes k, ConstBytes v, int B, int T, int NH, int NKV, int hs,
                           ConstTokens doc_start = {}, int window = 0);
// d_write: for dq, dk and dv together, as attention_backward's dqkv_write.
void gqa_attention_backward(KernelContext& ctx, DType dtype, Bytes dq, Bytes dk, Bytes dv,
                            ConstBytes dout, ConstBytes q, ConstBytes k, ConstBytes v,
                            ConstBytes out, ConstFloats lse, int B, int T, int NH, int NKV, int hs,
                            ConstTokens doc_start = {}, int window = 0,
                            GradWrite d_write = GradWrite::kAccumulate);

// For planning (zrt-mem): the bytes attention_forward / attention_backward (`backward`) and
// gqa_attention_forward / gqa_attention_backward ask KernelContext::workspace for at these
// shapes, on the CPU backend (`on_cpu`) or on a GPU with `options`' kernel choice; the same
// size functions the calls use. `documents`: the calls carry packed documents (doc_start), which
// cuDNN's attention leaves to zrt's kernels. Where cuDNN's attention takes the call its request
// is cuda::cudnn_attention_workspace_estimate's (cuDNN's own figure, measured), for a backward
// that writes its gradients in place as the models' do (GradWrite::kIntoZeros or kOverwrite;
// other callers' cuDNN backward adds room for q, k, v's gradients); a build without CUDA plans as
// if the CUDA build had cuDNN attention.
std::int64_t attention_workspace_bytes(bool on_cpu, const KernelOptions& options, DType dtype,
                                       int B, int T, int C, int NH, bool backward,
                                       bool documents = false);
// What CUDA attention runs under `options` in this build, in words, for a run's log (cuDNN's
// attention left out where the build lacks it).
std::string describe_cuda_attention(const KernelOptions& options);
// What the CUDA backend's fused paths did so far on this context (cuBLASLt's epilogues fused,
// declined or failed; cuDNN attention's passes), for a run's log; empty off CUDA.
std::string describe_cuda_fused_paths(KernelContext& ctx);
std::int64_t gqa_attention_workspace_bytes(bool on_cpu, const KernelOptions& options, DType dtype,
                                           int B, int T, int NH, int NKV, int hs, bool backward,
                                           bool documents = false);

}  // namespace zrt::kernels
