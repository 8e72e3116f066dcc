// Twins of the mixture-of-experts kernels (kernels/cuda/moe_router.cu, moe_permute.cu,
// moe_shared_gate.cu;
// grouped_linear.cu is cuBLAS alone). Where a CUDA kernel is a whole op of the CPU backend (the
// router, its losses, gather, combine) the CPU twin in kernels/cpu runs it; the dispatch plan's
// two kernels and combine's backward are pieces of an op, and their twins compute exactly what
// each kernel writes.
#include <cstdint>
#include <vector>

#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cpu/moe_shared_gate.h"
#include "kernels/grad_write.h"
#include "runtime/common/dtype.h"
#include "tests/standin/kernel_twins.h"
#include "tests/standin/twin_names.h"

namespace zrt::standin {

namespace {

using I64 = std::int64_t;
using namespace twin_names;
using kernels::GradWrite;
constexpr unsigned kThreads = 256;       // kernels/cuda/moe_router.cu, moe_permute.cu
constexpr unsigned kRankThreads = 1024;  // moe_permute.cu's per-expert scan

template <typename S>
void register_storage() {
  const char* s = cuda_name<S>();
  const I64 ss = sizeof(S);

  // ---- router: one thread per row ----
  twin<float*, float*, std::int32_t*, const S*, int, int, int, int>(
      sig("void " + kNs +
              "moe_router_forward_kernel<$S>(float*, float*, int*, $S const*, int, int, int, int)",
          s),
      [ss](KernelCall& k, float* probs, float* weights, std::int32_t* experts, const S* logits,
           int N, int E, int topk, int renormalize) {
        k.require_block(kThreads);
        k.writes(probs, I64{N} * E * 4, "probs");
        k.writes(weights, I64{N} * topk * 4, "weights");
        k.writes(experts, I64{N} * topk * 4, "experts");
        k.reads(logits, I64{N} * E * ss, "logits");
        k.run([=] {
          kernels::cpu::moe_router_forward<S>(probs, weights, experts, logits, N, E, topk,
                                              renormalize != 0);
        });
      });
  twin<S*, const float*, const float*, const std::int32_t*, const float*, int, int, int, int, int>(
      sig("void " + kNs +
              "moe_router_backward_kernel<$S>($S*, float const*, float const*, int const*, float "
              "const*, int, int, int, int, int)",
          s),
      [ss](KernelCall& k, S* dlogits, const float* dweights, const float* probs,
           const std::int32_t* experts, const float* dshared, int N, int E, int topk,
           int renormalize, int overwrite) {
        k.require_block(kThreads);
        k.writes(dlogits, I64{N} * E * ss, "dlogits");
        if (!overwrite) k.reads(dlogits, I64{N} * E * ss, "dlogits");
        k.reads(dweights, I64{N} * topk * 4, "dweights");
        k.reads(probs, I64{N} * E * 4, "probs");
        k.reads(experts, I64{N} * topk * 4, "experts");
        k.reads(dshared, I64{E} * 4, "dprobs_shared");
        k.run([=] {
          kernels::cpu::moe_router_backward<S>(
              dlogits, dweights, probs, experts, dshared, N, E, topk, renormalize != 0,
              overwrite ? GradWrite::kOverwrite : GradWrite::kAccumulate);
        });
      });
  twin<float*, const S*, int, int>(
      sig("void " + kNs + "moe_router_z_loss_forward_kernel<$S>(float*, $S const*, int, int)", s),
      [ss](KernelCall& k, float* loss, const S* logits, int N, int E) {
        k.require_block(kThreads);
        k.require(k.grid().x == 1, "one block");
        k.writes(loss, 4, "loss");
        k.reads(logits, I64{N} * E * ss, "logits");
        k.run([=] { kernels::cpu::moe_router_z_loss_forward<S>(loss, logits, N, E); });
      });
  twin<S*, const S*, float, int, int>(
      sig("void " + kNs + "moe_router_z_loss_backward_kernel<$S>($S*, $S const*, float, int, int)",
          s),
      [ss](KernelCall& k, S* dlogits, const S* logits, float dloss, int N, int E) {
        k.require_block(kThreads);
        k.writes(dlogits, I64{N} * E * ss, "dlogits");
        k.reads(dlogits, I64{N} * E * ss, "dlogits");
        k.reads(logits, I64{N} * E * ss, "logits");
        k.run([=] { kernels::cpu::moe_router_z_loss_backward<S>(dlogits, logits, dloss, N, E); });
      });

  // ---- Qwen2-MoE's shared expert gate: forward over elements, backward a thread per row ----
  twin<S*, const S*, const S*, int, int>(
      sig("void " + kNs + "moe_shared_gate_forward_kernel<$S>($S*, $S const*, $S const*, int, int)",
          s),
      [ss](KernelCall& k, S* out, const S* sv, const S* g, int N, int C) {
        k.writes(out, I64{N} * C * ss, "out");
        k.reads(out, I64{N} * C * ss, "out");
        k.reads(sv, I64{N} * C * ss, "s");
        k.reads(g, I64{N} * ss, "g");
        k.run([=] { kernels::cpu::moe_shared_gate_forward<S>(out, sv, g, N, C); });
      });
  twin<S*, S*, const S*, const S*, const S*, int, int>(
      sig("void " + kNs +
              "moe_shared_gate_backward_kernel<$S>($S*, $S*, $S const*, $S const*, $S const*, "
              "int, int)",
          s),
      [ss](KernelCall& k, S* ds, S* dg, const S* dout, const S* sv, const S* g, int N, int C) {
        k.require_block(kThreads);
        k.writes(ds, I64{N} * C * ss, "ds");
        k.writes(dg, I64{N} * ss, "dg");
        k.reads(dout, I64{N} * C * ss, "dout");
        k.reads(sv, I64{N} * C * ss, "s");
        k.reads(g, I64{N} * ss, "g");
        k.run([=] { kernels::cpu::moe_shared_gate_backward<S>(ds, dg, dout, sv, g, N, C); });
      });

  // ---- gather, combine and their backwards: grid-stride over elements ----
  twin<S*, const S*, const std::int32_t*, int, int, int>(
      sig("void " + kNs + "moe_gather_kernel<$S>($S*, $S const*, int const*, int, int, int)", s),
      [ss](KernelCall& k, S* xe, const S* x, const std::int32_t* row_of, int N, int topk, int C) {
        k.writes(xe, I64{N} * topk * C * ss, "xe");
        k.reads(x, I64{N} * C * ss, "x");
        k.reads(row_of, I64{N} * topk * 4, "row_of");
        k.run([=] { kernels::cpu::moe_gather<S>(xe, x, row_of, N, topk, C); });
      });
  twin<S*, const S*, const std::int32_t*, int, int, int>(
      sig("void " + kNs +
              "moe_gather_backward_kernel<$S>($S*, $S const*, int const*, int, int, int)",
          s),
      [ss](KernelCall& k, S* dx, const S* dxe, const std::int32_t* row_of, int N, int topk, int C) {
        k.writes(dx, I64{N} * C * ss, "dx");
        k.reads(dx, I64{N} * C * ss, "dx");
        k.reads(dxe, I64{N} * topk * C * ss, "dxe");
        k.reads(row_of, I64{N} * topk * 4, "row_of");
        k.run([=] { kernels::cpu::moe_gather_backward<S>(dx, dxe, row_of, N, topk, C); });
      });
  twin<S*, const S*, const float*, const std::int32_t*, int, int, int>(
      sig("void " + kNs +
              "moe_combine_kernel<$S>($S*, $S const*, float const*, int const*, int, int, int)",
          s),
      [ss](KernelCall& k, S* out, const S* y, const float* w, const std::int32_t* row_of, int N,
           int topk, int C) {
        k.writes(out, I64{N} * C * ss, "out");
        k.reads(y, I64{N} * topk * C * ss, "y");
        k.reads(w, I64{N} * topk * 4, "weights");
        k.reads(row_of, I64{N} * topk * 4, "row_of");
        k.run([=] { kernels::cpu::moe_combine<S>(out, y, w, row_of, N, topk, C); });
      });
  // Combine's backward is two kernels: dy (element-wise) and dweights (a warp per pair).
  twin<S*, const S*, const float*, const std::int32_t*, int, int, int>(
      sig("void " + kNs +
              "moe_combine_backward_dy_kernel<$S>($S*, $S const*, float const*, int const*, int, "
              "int, int)",
          s),
      [ss](KernelCall& k, S* dy, const S* dout, const float* w, const std::int32_t* row_of, int N,
           int topk, int C) {
        k.writes(dy, I64{N} * topk * C * ss, "dy");
        k.reads(dout, I64{N} * C * ss, "dout");
        k.reads(w, I64{N} * topk * 4, "weights");
        k.reads(row_of, I64{N} * topk * 4, "row_of");
        k.run([=] {
          for (I64 p = 0; p < I64{N} * topk; ++p) {
            if (row_of[p] < 0) continue;
            for (int c = 0; c < C; ++c) {
              dy[I64{row_of[p]} * C + c] = st<S>(w[p] * ld(dout[(p / topk) * C + c]));
            }
          }
        });
      });
  twin<float*, const S*, const S*, const std::int32_t*, int, int, int>(
      sig("void " + kNs +
              "moe_combine_backward_dw_kernel<$S>(float*, $S const*, $S const*, int const*, int, "
              "int, int)",
          s),
      [ss](KernelCall& k, float* dw, const S* dout, const S* y, const std::int32_t* row_of, int N,
           int topk, int C) {
        k.require_block(kThreads);
        k.writes(dw, I64{N} * topk * 4, "dweights");
        k.reads(dout, I64{N} * C * ss, "dout");
        k.reads(y, I64{N} * topk * C * ss, "y");
        k.reads(row_of, I64{N} * topk * 4, "row_of");
        k.run([=] {
          for (I64 p = 0; p < I64{N} * topk; ++p) {
            float dot = 0.0f;
            if (row_of[p] >= 0) {
              for (int c = 0; c < C; ++c) {
                dot += ld(dout[(p / topk) * C + c]) * ld(y[I64{row_of[p]} * C + c]);
              }
            }
            dw[p] = dot;
          }
        });
      });
}

void register_plain() {
  // ---- load-balancing statistics (a block per expert) and losses ----
  twin<float*, float*, const float*, const std::int32_t*, int, int, int>(
      kNs + "moe_aux_stats_kernel(float*, float*, float const*, int const*, int, int, int)",
      [](KernelCall& k, float* counts, float* probsum, const float* probs,
         const std::int32_t* experts, int N, int E, int topk) {
        k.require_block(kThreads);
        k.require(k.grid().x == static_cast<unsigned>(E), "a block per expert");
        k.writes(counts, I64{E} * 4, "counts");
        k.writes(probsum, I64{E} * 4, "probsum");
        k.reads(counts, I64{E} * 4, "counts");
        k.reads(probsum, I64{E} * 4, "probsum");
        k.reads(probs, I64{N} * E * 4, "probs");
        k.reads(experts, I64{N} * topk * 4, "experts");
        k.run([=] {
          kernels::cpu::moe_aux_stats_accumulate<float>(counts, probsum, probs, experts, N, E,
                                                        topk);
        });
      });
  twin<float*, const float*, const float*, int, float>(
      kNs + "moe_load_balancing_loss_kernel(float*, float const*, float const*, int, float)",
      [](KernelCall& k, float* loss, const float* counts, const float* probsum, int E, float rows) {
        k.writes(loss, 4, "loss");
        k.reads(counts, I64{E} * 4, "counts");
        k.reads(probsum, I64{E} * 4, "probsum");
        k.run([=] {
          kernels::cpu::moe_load_balancing_loss<float>(loss, counts, probsum, E,
                                                       static_cast<I64>(rows));
        });
      });
  twin<float*, const float*, float>(
      kNs + "moe_add_loss_term_kernel(float*, float const*, float)",
      [](KernelCall& k, float* loss, const float* term, float coef) {
        k.writes(loss, 4, "loss");
        k.reads(loss, 4, "loss");
        k.reads(term, 4, "term");
        k.run([=] { kernels::cpu::moe_add_loss_term<float>(loss, term, coef); });
      });
  twin<float*, const float*, float, int, float>(
      kNs + "moe_load_balancing_loss_backward_kernel(float*, float const*, float, int, float)",
      [](KernelCall& k, float* dshared, const float* counts, float dloss, int E, float rows) {
        k.require_threads(E, "experts E");
        k.writes(dshared, I64{E} * 4, "dprobs_shared");
        k.reads(counts, I64{E} * 4, "counts");
        k.run([=] {
          kernels::cpu::moe_load_balancing_loss_backward<float>(dshared, counts, dloss, E,
                                                                static_cast<I64>(rows));
        });
      });

  // ---- the dispatch plan: per-expert ranks, then rows ----
  twin<std::int32_t*, std::int32_t*, const std::int32_t*, long>(
      kNs + "moe_rank_kernel(int*, int*, int const*, long)",
      [](KernelCall& k, std::int32_t* counts, std::int32_t* row_of, const std::int32_t* experts,
         long pairs) {
        k.require_block(kRankThreads);
        const int E = static_cast<int>(k.grid().x);
        k.writes(counts, I64{E} * 4, "counts");
        k.writes(row_of, I64{pairs} * 4, "row_of");
        k.reads(experts, I64{pairs} * 4, "experts");
        k.run([=] {
          std::vector<std::int32_t> seen(E, 0);
          for (I64 p = 0; p < pairs; ++p) {
            const std::int32_t e = experts[p];
            if (e >= 0 && e < E) row_of[p] = seen[e]++;
          }
          for (int e = 0; e < E; ++e) counts[e] = seen[e];
        });
      });
  twin<std::int32_t*, std::int32_t*, std::int32_t*, const std::int32_t*, const std::int32_t*, long,
       int>(kNs + "moe_rows_kernel(int*, int*, int*, int const*, int const*, long, int)",
            [](KernelCall& k, std::int32_t* offsets, std::int32_t* row_of, std::int32_t* source,
               const std::int32_t* counts, const std::int32_t* experts, long pairs, int E) {
              k.require_block(kThreads);
              k.require_threads(pairs, "pairs");
              k.writes(offsets, I64{E + 1} * 4, "offsets");
              k.writes(row_of, I64{pairs} * 4, "row_of");
              k.reads(row_of, I64{pairs} * 4, "row_of");
              k.writes(source, I64{pairs} * 4, "source");
              k.reads(counts, I64{E} * 4, "counts");
              k.reads(experts, I64{pairs} * 4, "experts");
              k.run([=] {
                offsets[0] = 0;
                for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
                for (I64 p = 0; p < pairs; ++p) {
                  const std::int32_t e = experts[p];
                  if (e < 0 || e >= E) {
                    row_of[p] = -1;
                    continue;
                  }
                  row_of[p] += offsets[e];
                  source[row_of[p]] = static_cast<std::int32_t>(p);
                }
              });
            });
}

}  // namespace

void register_moe_twins() {
  register_storage<float>();
  register_storage<bf16>();
  register_storage<fp16>();
  register_plain();
}

}  // namespace zrt::standin
