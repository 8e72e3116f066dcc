// Finite-difference gradient checks in float64 of the Llama family's kernels (RMSNorm, nn.Linear
// projections with bias, rotary embeddings with llama3 frequency scaling, SwiGLU, grouped-query
// attention), the CPU twins instantiated with double. Each check takes L = sum(out * R) for a
// fixed random R and compares the analytic gradient of every input and parameter with central
// differences. The forward math itself is checked against transformers in test_llama.cc.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/rope_table.h"
#include "runtime/common/error.h"
#include "tests/kernels/fd_check.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::kernels::cpu {
namespace {

using test::check_gradient;
using test::dot;
using test::normal_values;
using Vec = std::vector<double>;

constexpr std::uint64_t kSeed = 1601;
constexpr int kB = 2, kT = 8, kC = 48, kNH = 6, kNKV = 2, kHS = 8;
constexpr int kN = kB * kT;

TEST_CASE("rmsnorm backward matches finite differences (float64)", "[fd][llama]") {
  Vec x = normal_values(kSeed, 1, kN * kC, 2.0, 0.5);
  Vec w = normal_values(kSeed, 2, kC, 0.1, 1.0);
  const Vec R = normal_values(kSeed, 3, kN * kC);
  Vec out(kN * kC), rstd(kN);
  auto f = [&] {
    rmsnorm_forward<double>(out.data(), rstd.data(), x.data(), w.data(), kN, kC, 1e-6);
    return dot(out, R);
  };
  f();
  // The forward against its definition.
  for (int n = 0; n < kN; ++n) {
    double ss = 0;
    for (int c = 0; c < kC; ++c) ss += x[n * kC + c] * x[n * kC + c];
    const double r = 1 / std::sqrt(ss / kC + 1e-6);
    CHECK(rstd[n] == Approx(r).epsilon(1e-14));
    CHECK(out[n * kC + 5] == Approx(x[n * kC + 5] * r * w[5]).epsilon(1e-14));
  }
  Vec dx(x.size(), 0.0), dw(w.size(), 0.0);
  rmsnorm_backward<double, double>(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(),
                                   kN, kC);
  check_gradient("dinp", x, dx, f);
  check_gradient("dweight", w, dw, f);
  // Gradients accumulate.
  Vec dx2 = dx, dw2 = dw;
  rmsnorm_backward<double, double>(dx2.data(), dw2.data(), R.data(), x.data(), w.data(),
                                   rstd.data(), kN, kC);
  for (std::size_t i = 0; i < dx.size(); ++i) CHECK(dx2[i] == Approx(2 * dx[i]).epsilon(1e-12));
  for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw2[i] == Approx(2 * dw[i]).epsilon(1e-12));
}

TEST_CASE("linear (nn.Linear layout) backward matches finite differences (float64)",
          "[fd][llama]") {
  const int OC = 40;
  Vec x = normal_values(kSeed, 11, kN * kC);
  Vec w = normal_values(kSeed, 12, OC * kC, 0.1);
  Vec b = normal_values(kSeed, 13, OC, 0.1);
  const Vec R = normal_values(kSeed, 14, kN * OC);
  Vec out(kN * OC);
  auto f = [&] {
    linear_forward<double>(out.data(), x.data(), w.data(), b.data(), kN, kC, OC, nullptr);
    return dot(out, R);
  };
  f();
  // out[n,o] = sum_c x[n,c] w[o,c] + b[o]: the weight is (out, in).
  double ref = b[7];
  for (int c = 0; c < kC; ++c) ref += x[3 * kC + c] * w[7 * kC + c];
  CHECK(out[3 * OC + 7] == Approx(ref).epsilon(1e-13));
  Vec dx(x.size(), 0.0), dw(w.size(), 0.0), db(b.size(), 0.0);
  linear_backward<double, double>(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), kN,
                                  kC, OC, nullptr);
  check_gradient("dinp", x, dx, f);
  check_gradient("dweight", w, dw, f);
  check_gradient("dbias", b, db, f);
}

TEST_CASE("rope rotates by t*inv_freq and its backward is the transpose (float64)", "[fd][llama]") {
  RopeScalingParams llama3;
  llama3.rope_type = "llama3";
  llama3.factor = 8;
  llama3.low_freq_factor = 1;
  llama3.high_freq_factor = 4;
  llama3.original_max_position_embeddings = 16;  // small, so that all three bands occur
  for (const auto& scaling : {RopeScalingParams{}, llama3}) {
    const RopeTable table = make_rope_table(kHS, 10000.0, scaling);
    Vec x = normal_values(kSeed, 21, kN * kNH * kHS);
    const Vec R = normal_values(kSeed, 22, kN * kNH * kHS);
    Vec out(x.size());
    auto f = [&] {
      rope_forward<double>(out.data(), x.data(), table, kB, kT, kNH, kHS);
      return dot(out, R);
    };
    f();
    // Row (b=1, t=5), head 2, pair 1 against the definition.
    const int P = kHS / 2, t = 5;
    const std::size_t off = ((std::size_t{1} * kT + t) * kNH + 2) * kHS;
    const double angle = t * static_cast<double>(table.inv_freq[1]);
    CHECK(out[off + 1] ==
          Approx(x[off + 1] * std::cos(angle) - x[off + 1 + P] * std::sin(angle)).epsilon(1e-14));
    CHECK(out[off + 1 + P] ==
          Approx(x[off + 1 + P] * std::cos(angle) + x[off + 1] * std::sin(angle)).epsilon(1e-14));
    Vec dx(x.size(), 7.0);  // overwritten, not accumulated
    rope_backward<double>(dx.data(), R.data(), table, kB, kT, kNH, kHS);
    check_gradient("dinp", x, dx, f);
    // In place: out == inp.
    f();  // out of the unperturbed x
    Vec inplace = x;
    rope_forward<double>(inplace.data(), inplace.data(), table, kB, kT, kNH, kHS);
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(inplace[i] == out[i]);
    rope_backward<double>(inplace.data(), inplace.data(), table, kB, kT, kNH, kHS);
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(inplace[i] == Approx(x[i]).margin(1e-14));
  }
}

TEST_CASE("llama3 rope table follows transformers' three frequency bands", "[llama]") {
  RopeScalingParams s;
  s.rope_type = "llama3";
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 8192;
  const int hd = 128;
  const RopeTable plain = make_rope_table(hd, 500000.0, {});
  const RopeTable scaled = make_rope_table(hd, 500000.0, s);
  REQUIRE(plain.pairs == 64);
  const double pi = std::acos(-1.0);
  int high = 0, low = 0, mid = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / hd);
    CHECK(plain.inv_freq[i] == static_cast<float>(f));
    const double wavelen = 2 * pi / f;
    if (wavelen < 8192.0 / 4) {
      CHECK(scaled.inv_freq[i] == plain.inv_freq[i]);
      ++high;
    } else if (wavelen > 8192.0 / 1) {
      CHECK(scaled.inv_freq[i] == static_cast<float>(f / 8));
      ++low;
    } else {
      CHECK(scaled.inv_freq[i] < plain.inv_freq[i]);
      CHECK(scaled.inv_freq[i] > static_cast<float>(f / 8));
      ++mid;
    }
  }
  CHECK(high > 0);
  CHECK(low > 0);
  CHECK(mid > 0);
  CHECK_THROWS_AS(make_rope_table(7, 10000.0, {}), InvalidArgument);
  RopeScalingParams bad;
  bad.rope_type = "yarn";
  CHECK_THROWS_WITH(make_rope_table(8, 10000.0, bad), Catch::Contains("yarn"));
}

TEST_CASE("swiglu backward matches finite differences (float64)", "[fd][llama]") {
  const int n = kN * 3 * kC;
  Vec g = normal_values(kSeed, 31, n, 2.0);
  Vec u = normal_values(kSeed, 32, n);
  const Vec R = normal_values(kSeed, 33, n);
  Vec out(n);
  auto f = [&] {
    swiglu_forward<double>(out.data(), g.data(), u.data(), n);
    return dot(out, R);
  };
  f();
  CHECK(out[9] == Approx(g[9] / (1 + std::exp(-g[9])) * u[9]).epsilon(1e-14));
  Vec dg(n, 0.0), du(n, 0.0);
  swiglu_backward<double>(dg.data(), du.data(), R.data(), g.data(), u.data(), n);
  check_gradient("dgate", g, dg, f);
  check_gradient("dup", u, du, f);
}

TEST_CASE("grouped-query attention backward matches finite differences (float64)", "[fd][llama]") {
  for (const int nkv : {kNKV, 1, kNH}) {
    INFO("NKV = " << nkv);
    Vec q = normal_values(kSeed, 41, kN * kNH * kHS);
    Vec k = normal_values(kSeed, 42, kN * nkv * kHS);
    Vec v = normal_values(kSeed, 43, kN * nkv * kHS);
    const Vec R = normal_values(kSeed, 44, kN * kNH * kHS);
    Vec out(q.size()), lse(static_cast<std::size_t>(kB) * kNH * kT);
    Vec ws(
        static_cast<std::size_t>(gqa_attention_backward_workspace<double>(kB, kT, kNH, nkv, kHS)));
    Vec fws(
        static_cast<std::size_t>(gqa_attention_forward_workspace<double>(kB, kT, kNH, nkv, kHS)));
    auto f = [&] {
      gqa_attention_forward<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), kB, kT,
                                    kNH, nkv, kHS, fws.data());
      return dot(out, R);
    };
    f();
    // Query head h reads kv head h / (NH/NKV): the output of (b=1, t=3, h=5) by hand.
    {
      const int b = 1, t = 3, h = 5, kh = h / (kNH / nkv);
      std::vector<double> s(t + 1);
      double mx = -1e300, sum = 0;
      for (int u = 0; u <= t; ++u) {
        double d = 0;
        for (int i = 0; i < kHS; ++i) {
          d += q[((b * kT + t) * kNH + h) * kHS + i] * k[((b * kT + u) * nkv + kh) * kHS + i];
        }
        s[u] = d / std::sqrt(double{kHS});
        mx = std::max(mx, s[u]);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      double o = 0;
      for (int u = 0; u <= t; ++u) o += s[u] / sum * v[((b * kT + u) * nkv + kh) * kHS + 2];
      CHECK(out[((b * kT + t) * kNH + h) * kHS + 2] == Approx(o).epsilon(1e-12));
      // The row's log-sum-exp, the statistic the backward recomputes the probabilities from.
      CHECK(lse[(static_cast<std::size_t>(b) * kNH + h) * kT + t] ==
            Approx(mx + std::log(sum)).epsilon(1e-12));
    }
    Vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    gqa_attention_backward<double>(dq.data(), dk.data(), dv.data(), R.data(), q.data(), k.data(),
                                   v.data(), out.data(), lse.data(), kB, kT, kNH, nkv, kHS,
                                   ws.data());
    check_gradient("dq", q, dq, f);
    check_gradient("dk", k, dk, f);
    check_gradient("dv", v, dv, f);
  }
}

}  // namespace
}  // namespace zrt::kernels::cpu
