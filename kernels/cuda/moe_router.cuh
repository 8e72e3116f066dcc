// CUDA twin of kernels/cpu/moe_router.h: the MoE router (softmax, top-k, renormalisation) and its
// backward one thread per row (E and k are small: a row is a few hundred bytes), the
// load-balancing statistics one block per expert, the losses in single blocks; every sum in a
// fixed order, so each result is the same bits run to run.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/grad_write.h"

namespace zrt::kernels::cuda {

void moe_router_forward(const Launch& l, DType dtype, float* probs, float* weights,
                        std::int32_t* experts, const void* logits, int N, int E, int k,
                        bool renormalize);
void moe_router_backward(const Launch& l, DType dtype, void* dlogits, const float* dweights,
                         const float* probs, const std::int32_t* experts,
                         const float* dprobs_shared, int N, int E, int k, bool renormalize,
                         GradWrite dlogits_write);

void moe_aux_stats_accumulate(const Launch& l, float* counts, float* probsum, const float* probs,
                              const std::int32_t* experts, int N, int E, int k);
void moe_load_balancing_loss(const Launch& l, float* loss, const float* counts,
                             const float* probsum, int E, std::int64_t total_rows);
void moe_add_loss_term(const Launch& l, float* loss, const float* term, float coef);
void moe_load_balancing_loss_backward(const Launch& l, float* dprobs_shared, const float* counts,
                                      float dloss, int E, std::int64_t total_rows);

void moe_router_z_loss_forward(const Launch& l, DType dtype, float* loss, const void* logits, int N,
                               int E);
void moe_router_z_loss_backward(const Launch& l, DType dtype, void* dlogits, const void* logits,
                                float dloss, int N, int E);

}  // namespace zrt::kernels::cuda
