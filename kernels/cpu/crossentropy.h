// The GPT-2 head: logits through the tied token embedding, softmax cross-entropy, and the mean
// loss. CPU twin of kernels/cuda/crossentropy.cu.
//
//   logits_forward:        logits (N,V) = inp (N,C) @ wte^T           (wte (V,C), no bias)
//   logits_backward:       dinp (N,C) += dlogits @ wte;  dwte (V,C) += dlogits^T @ inp
//   crossentropy_forward:  losses[n] = logsumexp(logits[n,:]) - logits[n,targets[n]]
//   crossentropy_backward: dlogits[n,:] = (softmax(logits[n,:]) - onehot(targets[n])) * dloss
//                          OVERWRITES dlogits (no accumulation) and may alias logits, so the
//                          gradient can replace the logits in place.
//   crossentropy_forward_backward: both of the above from one pass over each row's statistics
//                          (a training step's fused classifier; the logits are read once less).
//   loss_mean:             out[0] = sum(losses) / (divisor > 0 ? divisor : N), summed in double in
//                          index order (the divisor: the global batch's count of loss tokens,
//                          when masks leave some out).
//
// Softmax and losses are computed in acc_t<S>. A target < 0 marks a row that is not in the loss
// (fine-tuning masks, a document's last token): its loss is 0 and its dlogits row all zeros; the
// other targets must lie in [0,V) (InvalidArgument otherwise). 16-bit storage converts the
// logits GEMM operands to fp32 in `ws`.
//
// `ldl` is the logits' row stride in elements (0: dense, V). The models pad it
// (kernels::logits_row_stride) so every row is aligned for the GPU's GEMMs. The columns from V
// to ldl never reach a loss or a weight: logits_forward may leave scratch there,
// crossentropy_backward writes zeros (the CUDA head's padded GEMMs sum over them).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
std::int64_t logits_forward_workspace(int N, int C, int V, int ldl = 0);
template <typename S>
std::int64_t logits_backward_workspace(int N, int C, int V, int ldl = 0);

template <typename S>
void logits_forward(S* logits, const S* inp, const S* wte, int N, int C, int V, acc_t<S>* ws,
                    int ldl = 0);

template <typename S, typename G>
void logits_backward(S* dinp, G* dwte, const S* dlogits, const S* inp, const S* wte, int N, int C,
                     int V, acc_t<S>* ws, int ldl = 0);

template <typename S>
void crossentropy_forward(acc_t<S>* losses, const S* logits, const std::int32_t* targets, int N,
                          int V, int ldl = 0);

template <typename S>
void crossentropy_backward(S* dlogits, const S* logits, const std::int32_t* targets, acc_t<S> dloss,
                           int N, int V, int ldl = 0);

// Both at once: losses (may be null) and dlogits from one computation of each row's
// statistics, bit for bit the two calls above.
template <typename S>
void crossentropy_forward_backward(acc_t<S>* losses, S* dlogits, const S* logits,
                                   const std::int32_t* targets, acc_t<S> dloss, int N, int V,
                                   int ldl = 0);

template <typename A>
void loss_mean(A* out, const A* losses, int N, float divisor = 0.0f);

}  // namespace zrt::kernels::cpu
