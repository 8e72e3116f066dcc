// Bounds for comparing two fp32 (or float64) evaluations of the same attention whose sums may run
// in different orders: a packed call with doc_start against each document run alone (the kernel
// tests of packed documents, tests/kernels/test_kernels_fd.cc and test_llama_kernels_fd.cc).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/common/dtype.h"

namespace zrt::test {

using Vec = std::vector<double>;

// How far apart two evaluations of one document's attention may be when they differ only in the
// order of their sums: where a packed call and the document run alone may part. Both compute
// every element with the same operations on the same values (the packed call runs each
// document's GEMMs and rows at the document's own size), but BLAS may block a sum differently and
// the SIMD reductions (vec_math.h) may split it by the alignment of its start. So the bounds come
// from forward error analysis, per element, in double from the exact values (Higham, Accuracy and
// Stability, ch. 3): with u the unit roundoff of the compute type and g(n) = n u / (1 - n u), a
// sum of n terms in any order is within g(n) * sum|terms| of exact, and each computed quantity
// carries the errors of its inputs to first order:
//   scores s = scale q.k            |ds| <= g(hs+1) * scale sum|q k|                     (A)
//   max, e = exp(s - max)           relative ds + dmax + 8u (exp_approx within 2 ulp)
//   sum of e, p = e / sum           relative g(L) + max relative(e), then + 4u
//   lse = max + log(sum)            dmax + relative(sum) + 4u |lse|
//   out = sum_u p v                 sum rel(p) p |v| + g(L) sum p |v| + 2u |out|
//   backward p = exp(s - lse)       relative ds + dlse + 8u
//   dp = dout.v, D = dout.out       g(hs) sum|dout v|; sum |dout| dout_err + g(hs) sum|dout out|
//   dS = p (dp - D)                 rel(p) p |dp - D| + p (ddp + dD) + 4u p |dp - D|
//   dv = sum_t p dout, dq = scale sum_u dS k, dk = scale sum_t dS q: as out.
// The tiled kernel (kernels/cpu/tiled_attention.h) adds one step: its online softmax rescales a
// row's running sum and output by c = exp(m - m') each time a later key tile raises the row's
// max, so each term carries at most `rescales` such factors; c is exp of the difference of two
// computed scores (relative error 2 dmax + 8u) and each multiplication rounds once more (u):
//   tiled sum of e, p, out          relative + rescales (2 dmax + 9u)            (rescales = the
// number of key tiles a row spans; 0 for the full kernel, which leaves every other term as is).
// Two evaluations differ by at most twice one's error; that is doubled again for the second-order
// terms left out (they are below (n u)^2 relative), and 16-bit storage adds one spacing of the
// stored type (2^-7 |x| for bf16, 2^-10 for fp16) where two close fp32 values round apart. The
// result depends on the shapes and values only, not on the machine.
struct OrderBounds {
  Vec out, lse, dqkv;
};

inline OrderBounds order_bounds(const Vec& qkv, const Vec& dy, int L, int C, int NH, double u,
                                double spacing, int rescales = 0) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  auto g = [u](double n) { return n * u / (1 - n * u); };
  auto q = [&](int t, int d, int part, int h) {
    return qkv[static_cast<std::size_t>(t) * 3 * C + part * C + h * hs + d];
  };
  auto y = [&](int t, int d, int h) { return dy[static_cast<std::size_t>(t) * C + h * hs + d]; };
  const std::size_t LL = static_cast<std::size_t>(L) * L;
  OrderBounds e{Vec(static_cast<std::size_t>(L) * C), Vec(static_cast<std::size_t>(NH) * L),
                Vec(static_cast<std::size_t>(L) * 3 * C)};
  // Twice one evaluation's error, doubled; plus the storage spacing `sp` and a last rounding.
  auto finish = [u](double err, double x, double sp) {
    return 4 * err + (sp + 4 * u) * std::abs(x) + 1e-300;
  };
  for (int h = 0; h < NH; ++h) {
    Vec s(LL), es(LL), p(LL), rp(LL), rq(LL), dp(LL), edp(LL), gs(LL), eg(LL);
    Vec out(static_cast<std::size_t>(L) * hs), eout(out.size()), lse(L), else_(L), D(L), eD(L);
    for (int t = 0; t < L; ++t) {
      double mx = -1e300, emx = 0;
      for (int v = 0; v <= t; ++v) {
        double sc = 0, mag = 0;
        for (int d = 0; d < hs; ++d) {
          sc += q(t, d, 0, h) * q(v, d, 1, h);
          mag += std::abs(q(t, d, 0, h) * q(v, d, 1, h));
        }
        s[t * L + v] = scale * sc;
        es[t * L + v] = g(hs + 1) * scale * mag;
        mx = std::max(mx, s[t * L + v]);
        emx = std::max(emx, es[t * L + v]);
      }
      double sum = 0, re_max = 0;
      for (int v = 0; v <= t; ++v) {
        sum += std::exp(s[t * L + v] - mx);
        re_max = std::max(re_max, es[t * L + v] + emx + 8 * u);
      }
      const double rescale = rescales * (2 * emx + 9 * u);
      const double rsum = g(L) + re_max + 2 * u + rescale;
      lse[t] = mx + std::log(sum);
      else_[t] = emx + rsum + 4 * u * std::abs(lse[t]);
      for (int v = 0; v <= t; ++v) {
        p[t * L + v] = std::exp(s[t * L + v] - lse[t]);
        rp[t * L + v] = es[t * L + v] + emx + 8 * u + rsum + 4 * u + rescale;
        rq[t * L + v] = es[t * L + v] + else_[t] + 8 * u;
      }
      for (int d = 0; d < hs; ++d) {
        double o = 0, prop = 0, mag = 0;
        for (int v = 0; v <= t; ++v) {
          o += p[t * L + v] * q(v, d, 2, h);
          prop += rp[t * L + v] * p[t * L + v] * std::abs(q(v, d, 2, h));
          mag += p[t * L + v] * std::abs(q(v, d, 2, h));
        }
        out[t * hs + d] = o;
        // What the backward reads: the stored out, one evaluation's error plus half a spacing.
        eout[t * hs + d] = prop + g(L) * mag + 2 * u * std::abs(o) + 0.5 * spacing * std::abs(o);
        e.out[static_cast<std::size_t>(t) * C + h * hs + d] = finish(eout[t * hs + d], o, spacing);
      }
      e.lse[static_cast<std::size_t>(h) * L + t] = finish(else_[t], lse[t], 0.0);  // fp32 always
    }
    // Backward.
    for (int t = 0; t < L; ++t) {
      double dsum = 0, dmag = 0, dprop = 0;
      for (int d = 0; d < hs; ++d) {
        dsum += y(t, d, h) * out[t * hs + d];
        dmag += std::abs(y(t, d, h) * out[t * hs + d]);
        dprop += std::abs(y(t, d, h)) * eout[t * hs + d];
      }
      D[t] = dsum;
      eD[t] = dprop + g(hs) * dmag;
      for (int v = 0; v <= t; ++v) {
        double a = 0, mag = 0;
        for (int d = 0; d < hs; ++d) {
          a += y(t, d, h) * q(v, d, 2, h);
          mag += std::abs(y(t, d, h) * q(v, d, 2, h));
        }
        const std::size_t i = static_cast<std::size_t>(t) * L + v;
        dp[i] = a;
        edp[i] = g(hs) * mag;
        const double diff = std::abs(dp[i] - D[t]);
        gs[i] = p[i] * (dp[i] - D[t]);
        eg[i] = rq[i] * p[i] * diff + p[i] * (edp[i] + eD[t]) + 4 * u * p[i] * diff;
      }
    }
    for (int x = 0; x < L; ++x) {
      for (int d = 0; d < hs; ++d) {
        double dq = 0, edq = 0, mq = 0, dk = 0, edk = 0, mk = 0, dv = 0, edv = 0, mv = 0;
        for (int v = 0; v <= x; ++v) {  // dq[x] = scale sum_v dS[x][v] k[v]
          const std::size_t i = static_cast<std::size_t>(x) * L + v;
          dq += gs[i] * q(v, d, 1, h);
          edq += eg[i] * std::abs(q(v, d, 1, h));
          mq += std::abs(gs[i] * q(v, d, 1, h));
        }
        for (int t = x; t < L; ++t) {  // dk[x] = scale sum_t dS[t][x] q[t]; dv[x] = sum_t p dout
          const std::size_t i = static_cast<std::size_t>(t) * L + x;
          dk += gs[i] * q(t, d, 0, h);
          edk += eg[i] * std::abs(q(t, d, 0, h));
          mk += std::abs(gs[i] * q(t, d, 0, h));
          dv += p[i] * y(t, d, h);
          edv += rq[i] * p[i] * std::abs(y(t, d, h));
          mv += p[i] * std::abs(y(t, d, h));
        }
        const std::size_t row = static_cast<std::size_t>(x) * 3 * C + h * hs + d;
        e.dqkv[row] = finish(scale * (edq + g(L) * mq), scale * dq, spacing);
        e.dqkv[row + C] = finish(scale * (edk + g(L) * mk), scale * dk, spacing);
        e.dqkv[row + 2 * C] = finish(edv + g(L) * mv, dv, spacing);
      }
    }
  }
  return e;
}

// Each element of `got` within its bound of `want`; reports the worst ratio.
inline void check_within(const std::string& what, const Vec& got, const Vec& want,
                         const Vec& bound) {
  REQUIRE(got.size() == want.size());
  REQUIRE(got.size() == bound.size());
  double worst = 0;
  std::size_t at = 0, over = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double ratio = std::abs(got[i] - want[i]) / bound[i];
    if (ratio > worst) {
      worst = ratio;
      at = i;
    }
    over += ratio > 1 ? 1 : 0;
  }
  INFO(what << ": " << over << " of " << got.size() << " elements past their bound; worst |diff| / "
            << "bound " << worst << " at " << at << " (" << got[at] << " vs " << want[at] << ")");
  CHECK(over == 0);
}

template <typename S>
double spacing_of() {
  if constexpr (std::is_same_v<S, bf16>) return std::ldexp(1.0, -7);
  if constexpr (std::is_same_v<S, fp16>) return std::ldexp(1.0, -10);
  return 0.0;
}

}  // namespace zrt::test
