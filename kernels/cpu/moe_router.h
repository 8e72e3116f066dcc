// The mixture-of-experts router and its auxiliary losses: CPU twin of kernels/cuda/moe_router.cu.
// transformers' MixtralTopKRouter / Qwen2MoeTopKRouter / Qwen3MoeTopKRouter after the gate's
// linear, and load_balancing_loss_func (transformers 5.x) for L layers without an attention mask.
//
// Router, per row n of logits (N,E) (storage S, read as acc_t<S>):
//   probs[n]   = softmax(logits[n])                                   (N,E), kept for the backward
//   experts[n] = the k experts of largest probs[n], largest first; among equal probabilities the
//                lower expert index comes first (a total order, so CPU and CUDA agree)   (N,k)
//   weights[n,j] = probs[n,experts[n,j]], divided by their sum over j when `renormalize`
//                (Mixtral always; Qwen2/3-MoE when config.norm_topk_prob)              (N,k)
// Backward: with v_j = probs[n,experts[n,j]] and S = sum_j v_j,
//   dv_j = renormalize ? (dweights[n,j] - sum_i dweights[n,i] * weights[n,i]) / S : dweights[n,j]
//   dprobs[n,e] = sum_{j: experts[n,j]=e} dv_j + dprobs_shared[e]
//   dlogits[n,e] (+)= probs[n,e] * (dprobs[n,e] - sum_e' probs[n,e'] * dprobs[n,e'])
// dweights may be null (no gradient through the weights: the loss term alone); dprobs_shared (E),
// one term every row shares, is the load-balancing loss's gradient (below), or null.
//
// Load-balancing loss over L layers of N rows each (T = L*N rows in all; no attention mask):
//   counts[e]  += the number of (row, slot) pairs of a layer choosing e (each of the k slots counts
//                 one, as torch.histc over selected_experts does), summed over the layers
//   probsum[e] += sum over the layer's rows of probs[n,e]
//   loss = E * sum_e (counts[e] / T) * (probsum[e] / T)
// Its gradient with respect to probs[n,e] of any row of any layer is the same for every row:
//   dprobs_shared[e] = dloss * E * counts[e] / T^2    (counts come from top-k: no gradient)
// transformers recomputes the softmax of each layer's logits in the logits' dtype; these take the
// router's probs (computed from the logits in fp32), the same in fp32 and one rounding apart in
// 16-bit models.
//
// Router z-loss (ST-MoE), mean over the N rows of one layer's logits:
//   z = (1/N) sum_n lse_n^2 with lse_n = logsumexp(logits[n]),
//   dlogits[n,e] += dz * 2 * lse_n * softmax(logits[n])[e] / N
//
// Accumulation is in acc_t<S> (fp32, or double for the finite-difference checks), sums in a fixed
// order (over e for a row; over rows in row order for the statistics; the z-loss sum in double).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"
#include "kernels/grad_write.h"

namespace zrt::kernels::cpu {

template <typename S>
void moe_router_forward(acc_t<S>* probs, acc_t<S>* weights, std::int32_t* experts, const S* logits,
                        int N, int E, int k, bool renormalize);

template <typename S>
void moe_router_backward(S* dlogits, const acc_t<S>* dweights, const acc_t<S>* probs,
                         const std::int32_t* experts, const acc_t<S>* dprobs_shared, int N, int E,
                         int k, bool renormalize, GradWrite dlogits_write);

// A = float or double.
template <typename A>
void moe_aux_stats_accumulate(A* counts, A* probsum, const A* probs, const std::int32_t* experts,
                              int N, int E, int k);
// loss[0] += coef * term[0]: an auxiliary loss added to the training loss.
template <typename A>
void moe_add_loss_term(A* loss, const A* term, A coef);
template <typename A>
void moe_load_balancing_loss(A* loss, const A* counts, const A* probsum, int E,
                             std::int64_t total_rows);
template <typename A>
void moe_load_balancing_loss_backward(A* dprobs_shared, const A* counts, A dloss, int E,
                                      std::int64_t total_rows);

template <typename S>
void moe_router_z_loss_forward(acc_t<S>* loss, const S* logits, int N, int E);
template <typename S>
void moe_router_z_loss_backward(S* dlogits, const S* logits, acc_t<S> dloss, int N, int E);

}  // namespace zrt::kernels::cpu
