// Finite-difference gradient checks in float64 of the Llama family's kernels (RMSNorm, nn.Linear
// projections with bias, rotary embeddings with llama3 frequency scaling, SwiGLU, grouped-query
// attention), the CPU twins instantiated with double. Each check takes L = sum(out * R) for a
// fixed random R and compares the analytic gradient of every input and parameter with central
// differences. The forward math itself is checked against transformers in test_llama.cc. Then
// packed documents: rope with positions and grouped-query attention with doc_start, against each
// document run alone and across a boundary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/rope_table.h"
#include "runtime/common/error.h"
#include "tests/kernels/attention_order_bounds.h"
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
  // A frozen weight (null dweight): the column sums are skipped, dinp is the same computation.
  Vec dx_frozen(x.size(), 0.0);
  rmsnorm_backward<double, double>(dx_frozen.data(), nullptr, R.data(), x.data(), w.data(),
                                   rstd.data(), kN, kC);
  CHECK(dx_frozen == dx);
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
  // YaRN: the ramp crosses the head's pairs at this original context, and its attention factor
  // (1.139) scales the rotation: backward(forward(x)) is then factor^2 x.
  RopeScalingParams yarn;
  yarn.rope_type = "yarn";
  yarn.factor = 4;
  yarn.original_max_position_embeddings = 64;
  for (const auto& scaling : {RopeScalingParams{}, llama3, yarn}) {
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
    const double a = table.attention_scaling;
    CHECK(a == (scaling.rope_type == "yarn" ? Approx(0.1 * std::log(4.0) + 1).epsilon(1e-7)
                                            : Approx(1.0).epsilon(0)));
    CHECK(out[off + 1] ==
          Approx(a * (x[off + 1] * std::cos(angle) - x[off + 1 + P] * std::sin(angle)))
              .epsilon(1e-14));
    CHECK(out[off + 1 + P] ==
          Approx(a * (x[off + 1 + P] * std::cos(angle) + x[off + 1] * std::sin(angle)))
              .epsilon(1e-14));
    Vec dx(x.size(), 7.0);  // overwritten, not accumulated
    rope_backward<double>(dx.data(), R.data(), table, kB, kT, kNH, kHS);
    check_gradient("dinp", x, dx, f);
    // In place: out == inp.
    f();  // out of the unperturbed x
    Vec inplace = x;
    rope_forward<double>(inplace.data(), inplace.data(), table, kB, kT, kNH, kHS);
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(inplace[i] == out[i]);
    rope_backward<double>(inplace.data(), inplace.data(), table, kB, kT, kNH, kHS);
    for (std::size_t i = 0; i < x.size(); ++i) {
      CHECK(inplace[i] == Approx(a * a * x[i]).margin(1e-14));
    }
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
  bad.rope_type = "dynamic";
  CHECK_THROWS_WITH(make_rope_table(8, 10000.0, bad),
                    Catch::Contains("'dynamic' is not supported"));
  bad.rope_type = "yarn";
  bad.beta_fast = 1;
  bad.beta_slow = 2;
  CHECK_THROWS_WITH(make_rope_table(8, 10000.0, bad), Catch::Contains("beta_fast >= beta_slow"));
  bad.rope_type = "linear";
  bad.factor = 0.5;
  CHECK_THROWS_WITH(make_rope_table(8, 10000.0, bad), Catch::Contains("factor >= 1"));
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

// ---- Packed documents: rope with positions, grouped-query attention with doc_start ------------

TEST_CASE("rope with positions rotates each token by its document position (float64)",
          "[fd][llama][docs]") {
  const test::Packing pack = test::pack_documents({{3, 1, 4}, {8}}, kT);
  const std::int32_t* pos = pack.positions.data();
  const RopeTable table = make_rope_table(kHS, 10000.0, {});
  Vec x = normal_values(kSeed, 121, kN * kNH * kHS);
  const Vec R = normal_values(kSeed, 122, kN * kNH * kHS);
  Vec out(x.size());
  auto f = [&] {
    rope_forward<double>(out.data(), x.data(), table, kB, kT, kNH, kHS, pos);
    return dot(out, R);
  };
  f();
  // Row (b=0, t=6) is position 2 of the document starting at 4: rotated by 2, not 6.
  const int P = kHS / 2;
  const std::size_t off = (std::size_t{6} * kNH + 1) * kHS;
  const double angle = 2 * static_cast<double>(table.inv_freq[1]);
  CHECK(out[off + 1] ==
        Approx(x[off + 1] * std::cos(angle) - x[off + 1 + P] * std::sin(angle)).epsilon(1e-14));
  Vec dx(x.size(), 7.0);
  rope_backward<double>(dx.data(), R.data(), table, kB, kT, kNH, kHS, pos);
  check_gradient("dinp", x, dx, f);
}

namespace {
// Each row is rotated on its own, by an angle computed in double from its position: a packed
// sequence and its documents alone give the same bits, and positions 0..T-1 the unpacked op's.
template <typename S>
void check_rope_packed_equals_separate() {
  const int T = 150, NH = 2, HS = 16;
  const test::Packing pack = test::pack_documents({{1, 80, 1, 37, 31}, {70, 80}}, T);
  const RopeTable table = make_rope_table(HS, 10000.0, {});
  const std::size_t row = std::size_t{NH} * HS;
  const auto x = test::to_storage<S>(normal_values(kSeed, 125, 2 * T * row));
  std::vector<S> packed(x.size()), dpacked(x.size());
  rope_forward<S>(packed.data(), x.data(), table, 2, T, NH, HS, pack.positions.data());
  rope_backward<S>(dpacked.data(), x.data(), table, 2, T, NH, HS, pack.positions.data());
  for (const auto& doc : pack.spans) {
    INFO("document of sequence " << doc.b << " at " << doc.begin);
    const auto first = x.begin() + (static_cast<std::ptrdiff_t>(doc.b) * T + doc.begin) * row;
    const std::vector<S> xs(first, first + static_cast<std::ptrdiff_t>(doc.length) * row);
    std::vector<S> alone(xs.size()), dalone(xs.size());
    rope_forward<S>(alone.data(), xs.data(), table, 1, doc.length, NH, HS);
    rope_backward<S>(dalone.data(), xs.data(), table, 1, doc.length, NH, HS);
    const std::size_t at = (static_cast<std::size_t>(doc.b) * T + doc.begin) * row;
    CHECK(test::to_double(std::vector<S>(packed.begin() + at, packed.begin() + at + xs.size())) ==
          test::to_double(alone));
    CHECK(test::to_double(std::vector<S>(dpacked.begin() + at, dpacked.begin() + at + xs.size())) ==
          test::to_double(dalone));
  }
  std::vector<std::int32_t> identity(2 * T);
  for (int i = 0; i < 2 * T; ++i) identity[i] = i % T;
  std::vector<S> null(x.size()), with(x.size());
  rope_forward<S>(null.data(), x.data(), table, 2, T, NH, HS);
  rope_forward<S>(with.data(), x.data(), table, 2, T, NH, HS, identity.data());
  CHECK(test::to_double(with) == test::to_double(null));
  rope_backward<S>(null.data(), x.data(), table, 2, T, NH, HS);
  rope_backward<S>(with.data(), x.data(), table, 2, T, NH, HS, identity.data());
  CHECK(test::to_double(with) == test::to_double(null));
}
}  // namespace

TEST_CASE("rope with positions equals each document run alone", "[llama][docs]") {
  check_rope_packed_equals_separate<float>();
  check_rope_packed_equals_separate<bf16>();
  check_rope_packed_equals_separate<double>();
}

TEST_CASE("grouped-query attention with packed documents matches finite differences (float64)",
          "[fd][llama][docs]") {
  const test::Packing pack = test::pack_documents({{1, 4, 1, 2}, {5, 3}}, kT);
  for (const int nkv : {kNKV, 1}) {
    INFO("NKV = " << nkv);
    Vec q = normal_values(kSeed, 141, kN * kNH * kHS);
    Vec k = normal_values(kSeed, 142, kN * nkv * kHS);
    Vec v = normal_values(kSeed, 143, kN * nkv * kHS);
    const Vec R = normal_values(kSeed, 144, kN * kNH * kHS);
    Vec out(q.size()), lse(static_cast<std::size_t>(kB) * kNH * kT);
    Vec ws(
        static_cast<std::size_t>(gqa_attention_backward_workspace<double>(kB, kT, kNH, nkv, kHS)));
    Vec fws(
        static_cast<std::size_t>(gqa_attention_forward_workspace<double>(kB, kT, kNH, nkv, kHS)));
    auto f = [&] {
      gqa_attention_forward<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), kB, kT,
                                    kNH, nkv, kHS, fws.data(), pack.doc_start.data());
      return dot(out, R);
    };
    f();
    Vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    gqa_attention_backward<double>(dq.data(), dk.data(), dv.data(), R.data(), q.data(), k.data(),
                                   v.data(), out.data(), lse.data(), kB, kT, kNH, nkv, kHS,
                                   ws.data(), pack.doc_start.data());
    check_gradient("dq", q, dq, f);
    check_gradient("dk", k, dk, f);
    check_gradient("dv", v, dv, f);
    // A 1-token document (b=0, t=5) sees itself alone: its output is its own v row.
    const int kh = 3 / (kNH / nkv);
    CHECK(out[(5 * kNH + 3) * kHS + 2] == Approx(v[(5 * nkv + kh) * kHS + 2]).epsilon(1e-14));
  }
}

namespace {
struct GqaRun {
  Vec out, lse, dq, dk, dv;
};

// Grouped-query attention forward and backward (gradients from zero) on the CPU twin in S.
template <typename S>
GqaRun run_gqa(const Vec& q, const Vec& k, const Vec& v, const Vec& dy, int B, int T, int NH,
               int NKV, int HS, const std::int32_t* doc_start) {
  using A = acc_t<S>;
  const auto qs = test::to_storage<S>(q), ks = test::to_storage<S>(k), vs = test::to_storage<S>(v),
             dys = test::to_storage<S>(dy);
  std::vector<A> ws(
      static_cast<std::size_t>(std::max(gqa_attention_forward_workspace<S>(B, T, NH, NKV, HS),
                                        gqa_attention_backward_workspace<S>(B, T, NH, NKV, HS))) +
      1);
  std::vector<S> out(qs.size());
  std::vector<A> lse(static_cast<std::size_t>(B) * NH * T);
  auto dq = test::to_storage<S>(Vec(q.size(), 0.0)), dk = test::to_storage<S>(Vec(k.size(), 0.0)),
       dv = test::to_storage<S>(Vec(v.size(), 0.0));
  gqa_attention_forward<S>(out.data(), lse.data(), qs.data(), ks.data(), vs.data(), B, T, NH, NKV,
                           HS, ws.data(), doc_start);
  gqa_attention_backward<S>(dq.data(), dk.data(), dv.data(), dys.data(), qs.data(), ks.data(),
                            vs.data(), out.data(), lse.data(), B, T, NH, NKV, HS, ws.data(),
                            doc_start);
  return {test::to_double(out), test::to_double(lse), test::to_double(dq), test::to_double(dk),
          test::to_double(dv)};
}

Vec slice(const Vec& x, std::size_t first, std::size_t n) {
  return Vec(x.begin() + static_cast<std::ptrdiff_t>(first),
             x.begin() + static_cast<std::ptrdiff_t>(first + n));
}

// Packed GQA against each document alone. Both pack q and the repeated k, v heads into
// attention's layout and run it, so the attention part of each output is bounded as
// attention_order_bounds.h derives (on the packed layout, built here in double), and dk, dv add
// the group's heads' parts in a fixed order: a sum of `group` terms, each side within
// g(group) sum|parts| of exact on top of the parts' own bounds (doubled, as there).
template <typename S>
void check_gqa_packed_equals_separate() {
  using A = acc_t<S>;
  const int T = 150, NH = 4, NKV = 2, HS = 16, C = NH * HS, KC = NKV * HS, group = NH / NKV;
  const test::Packing pack = test::pack_documents({{1, 80, 1, 37, 31}, {70, 80}}, T);
  const Vec q = normal_values(kSeed, 131, 2 * T * C), k = normal_values(kSeed, 132, 2 * T * KC),
            v = normal_values(kSeed, 133, 2 * T * KC), dy = normal_values(kSeed, 134, 2 * T * C);
  // The inputs as S holds them, so that the bounds see the values the kernels see.
  const Vec qd = test::to_double(test::to_storage<S>(q)),
            kd = test::to_double(test::to_storage<S>(k)),
            vd = test::to_double(test::to_storage<S>(v)),
            dyd = test::to_double(test::to_storage<S>(dy));
  const GqaRun packed = run_gqa<S>(q, k, v, dy, 2, T, NH, NKV, HS, pack.doc_start.data());
  const double u = std::is_same_v<A, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  auto g = [u](double n) { return n * u / (1 - n * u); };
  for (const auto& doc : pack.spans) {
    INFO("document of sequence " << doc.b << " at " << doc.begin << ", " << doc.length
                                 << " tokens");
    const std::size_t r0 = static_cast<std::size_t>(doc.b) * T + doc.begin, L = doc.length;
    const Vec dq_in = slice(qd, r0 * C, L * C), dk_in = slice(kd, r0 * KC, L * KC),
              dv_in = slice(vd, r0 * KC, L * KC), dy_in = slice(dyd, r0 * C, L * C);
    const GqaRun alone =
        run_gqa<S>(dq_in, dk_in, dv_in, dy_in, 1, doc.length, NH, NKV, HS, nullptr);
    Vec qkv(L * 3 * C);
    for (std::size_t t = 0; t < L; ++t) {
      for (int c = 0; c < C; ++c) {
        const std::size_t src = t * KC + (c / HS / group) * HS + c % HS;
        qkv[t * 3 * C + c] = dq_in[t * C + c];
        qkv[t * 3 * C + C + c] = dk_in[src];
        qkv[t * 3 * C + 2 * C + c] = dv_in[src];
      }
    }
    const test::OrderBounds b =
        test::order_bounds(qkv, dy_in, doc.length, C, NH, u, test::spacing_of<S>());
    // The parts the group sums add, in double: attention on the packed layout.
    Vec parts(qkv.size(), 0.0), y(L * C), l(NH * L);
    {
      Vec ws(static_cast<std::size_t>(
          std::max(attention_forward_workspace<double>(1, doc.length, C, NH),
                   attention_backward_workspace<double>(1, doc.length, C, NH))));
      attention_forward<double>(y.data(), l.data(), qkv.data(), 1, doc.length, C, NH, ws.data());
      attention_backward<double>(parts.data(), dy_in.data(), qkv.data(), y.data(), l.data(), 1,
                                 doc.length, C, NH, ws.data());
    }
    const Vec lse_packed = [&] {
      Vec x;
      for (int h = 0; h < NH; ++h) {
        const Vec part =
            slice(packed.lse, (static_cast<std::size_t>(doc.b) * NH + h) * T + doc.begin, L);
        x.insert(x.end(), part.begin(), part.end());
      }
      return x;
    }();
    test::check_within("out", slice(packed.out, r0 * C, L * C), alone.out, b.out);
    test::check_within("lse", lse_packed, alone.lse, b.lse);
    Vec bdq(L * C), bdk(L * KC), bdv(L * KC);
    for (std::size_t t = 0; t < L; ++t) {
      for (int c = 0; c < C; ++c) bdq[t * C + c] = b.dqkv[t * 3 * C + c];
      for (int c = 0; c < KC; ++c) {
        const int kh = c / HS, d = c % HS;
        double bk = 0, bv = 0, mk = 0, mv = 0;
        for (int gi = 0; gi < group; ++gi) {
          const std::size_t col = t * 3 * C + static_cast<std::size_t>(kh * group + gi) * HS + d;
          bk += b.dqkv[col + C];
          bv += b.dqkv[col + 2 * C];
          mk += std::abs(parts[col + C]);
          mv += std::abs(parts[col + 2 * C]);
        }
        bdk[t * KC + c] = bk + 4 * g(group) * mk;
        bdv[t * KC + c] = bv + 4 * g(group) * mv;
      }
    }
    test::check_within("dq", slice(packed.dq, r0 * C, L * C), alone.dq, bdq);
    test::check_within("dk", slice(packed.dk, r0 * KC, L * KC), alone.dk, bdk);
    test::check_within("dv", slice(packed.dv, r0 * KC, L * KC), alone.dv, bdv);
  }
  // A change to one token of document [1, 81) leaves every other document's results, bit for bit.
  Vec q2 = q, k2 = k, v2 = v, dy2 = dy;
  const std::size_t t = 40;
  for (int c = 0; c < C; ++c) {
    q2[t * C + c] += 3.0;
    dy2[t * C + c] -= 2.0;
  }
  for (int c = 0; c < KC; ++c) {
    k2[t * KC + c] += 3.0;
    v2[t * KC + c] -= 1.0;
  }
  const GqaRun changed = run_gqa<S>(q2, k2, v2, dy2, 2, T, NH, NKV, HS, pack.doc_start.data());
  for (const auto& doc : pack.spans) {
    if (doc.b == 0 && doc.begin == 1) continue;
    INFO("document of sequence " << doc.b << " at " << doc.begin);
    const std::size_t r0 = static_cast<std::size_t>(doc.b) * T + doc.begin, L = doc.length;
    CHECK(slice(changed.out, r0 * C, L * C) == slice(packed.out, r0 * C, L * C));
    CHECK(slice(changed.dq, r0 * C, L * C) == slice(packed.dq, r0 * C, L * C));
    CHECK(slice(changed.dk, r0 * KC, L * KC) == slice(packed.dk, r0 * KC, L * KC));
    CHECK(slice(changed.dv, r0 * KC, L * KC) == slice(packed.dv, r0 * KC, L * KC));
    for (int h = 0; h < NH; ++h) {
      const std::size_t at = (static_cast<std::size_t>(doc.b) * NH + h) * T + doc.begin;
      CHECK(slice(changed.lse, at, L) == slice(packed.lse, at, L));
    }
  }
  CHECK(slice(changed.dk, 1 * KC, 80 * KC) != slice(packed.dk, 1 * KC, 80 * KC));
}
}  // namespace

TEST_CASE("grouped-query attention with packed documents equals each document run alone",
          "[llama][docs]") {
  check_gqa_packed_equals_separate<double>();
  check_gqa_packed_equals_separate<float>();
  check_gqa_packed_equals_separate<bf16>();
}

}  // namespace
}  // namespace zrt::kernels::cpu
