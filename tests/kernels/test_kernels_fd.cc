// Finite-difference gradient checks in float64 of every layer's backward (the CPU twins
// instantiated with double), at the tiny GPT's widths (C = 64, 4 heads, V = 256). Each check
// takes L = sum(out * R) for a fixed random R, compares the analytic gradient of every input
// and parameter against central differences on (up to ~1500 sampled) elements.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "tests/kernels/fd_check.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::kernels::cpu {
namespace {

using test::check_gradient;
using test::dot;
using test::normal_values;
using Vec = std::vector<double>;

constexpr std::uint64_t kSeed = 77;
constexpr int kB = 2, kT = 8, kC = 64, kNH = 4, kV = 256;
constexpr int kN = kB * kT;

TEST_CASE("encoder backward matches finite differences (float64)", "[fd]") {
  Vec wte = normal_values(kSeed, 1, kV * kC);
  Vec wpe = normal_values(kSeed, 2, kT * kC);
  const Vec R = normal_values(kSeed, 3, kN * kC);
  auto tokens = test::token_values(kSeed, 4, kN, kV);
  tokens[3] = tokens[0];  // repeated tokens: gradients of one row of wte from several positions
  tokens[12] = tokens[0];
  tokens[9] = tokens[5];
  Vec out(kN * kC);
  auto f = [&] {
    encoder_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC, kV);
    return dot(out, R);
  };
  Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  encoder_backward<double, double>(dwte.data(), dwpe.data(), R.data(), tokens.data(), kB, kT, kC,
                                   kV);
  check_gradient("dwte", wte, dwte, f);
  check_gradient("dwpe", wpe, dwpe, f);
}

TEST_CASE("layernorm backward matches finite differences (float64)", "[fd]") {
  Vec x = normal_values(kSeed, 11, kN * kC, 2.0, 0.5);
  Vec w = normal_values(kSeed, 12, kC, 0.1, 1.0);
  Vec b = normal_values(kSeed, 13, kC, 0.1);
  const Vec R = normal_values(kSeed, 14, kN * kC);
  Vec out(kN * kC), mean(kN), rstd(kN);
  auto f = [&] {
    layernorm_forward<double>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                              kN, kC);
    return dot(out, R);
  };
  f();
  Vec dx(x.size(), 0.0), dw(w.size(), 0.0), db(b.size(), 0.0);
  layernorm_backward<double, double>(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                                     mean.data(), rstd.data(), kN, kC);
  check_gradient("dinp", x, dx, f);
  check_gradient("dweight", w, dw, f);
  check_gradient("dbias", b, db, f);
}

TEST_CASE("matmul backward matches finite differences (float64)", "[fd]") {
  const int OC = 3 * kC;
  Vec x = normal_values(kSeed, 21, kN * kC);
  Vec w = normal_values(kSeed, 22, kC * OC, 0.1);
  Vec b = normal_values(kSeed, 23, OC, 0.1);
  const Vec R = normal_values(kSeed, 24, kN * OC);
  Vec out(kN * OC);
  auto f = [&] {
    matmul_forward<double>(out.data(), x.data(), w.data(), b.data(), kN, kC, OC, nullptr);
    return dot(out, R);
  };
  Vec dx(x.size(), 0.0), dw(w.size(), 0.0), db(b.size(), 0.0);
  matmul_backward<double, double>(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), kN,
                                  kC, OC, nullptr);
  check_gradient("dinp", x, dx, f);
  check_gradient("dweight", w, dw, f);
  check_gradient("dbias", b, db, f);
}

TEST_CASE("gelu backward matches finite differences (float64)", "[fd]") {
  const int n = kN * 4 * kC;
  Vec x = normal_values(kSeed, 31, n, 2.0);
  const Vec R = normal_values(kSeed, 32, n);
  Vec out(n);
  auto f = [&] {
    gelu_forward<double>(out.data(), x.data(), n);
    return dot(out, R);
  };
  Vec dx(n, 0.0);
  gelu_backward<double>(dx.data(), x.data(), R.data(), n);
  check_gradient("dinp", x, dx, f);
}

TEST_CASE("residual backward matches finite differences (float64)", "[fd]") {
  const int n = kN * kC;
  Vec a = normal_values(kSeed, 41, n);
  Vec b = normal_values(kSeed, 42, n);
  const Vec R = normal_values(kSeed, 43, n);
  Vec out(n);
  auto f = [&] {
    residual_forward<double>(out.data(), a.data(), b.data(), n);
    return dot(out, R);
  };
  Vec da(n, 0.0), db(n, 0.0);
  residual_backward<double>(da.data(), db.data(), R.data(), n);
  check_gradient("da", a, da, f);
  check_gradient("db", b, db, f);
}

TEST_CASE("attention backward matches finite differences (float64)", "[fd]") {
  Vec qkv = normal_values(kSeed, 51, kN * 3 * kC);
  const Vec R = normal_values(kSeed, 52, kN * kC);
  Vec out(kN * kC), lse(static_cast<std::size_t>(kB) * kNH * kT);
  Vec ws(static_cast<std::size_t>(std::max(attention_forward_workspace<double>(kB, kT, kC, kNH),
                                           attention_backward_workspace<double>(kB, kT, kC, kNH))));
  auto f = [&] {
    attention_forward<double>(out.data(), lse.data(), qkv.data(), kB, kT, kC, kNH, ws.data());
    return dot(out, R);
  };
  f();
  Vec dqkv(qkv.size(), 0.0);
  attention_backward<double>(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), kB, kT, kC,
                             kNH, ws.data());
  check_gradient("dqkv", qkv, dqkv, f);
  // The kept statistic is each row's log-sum-exp over the causal prefix, summed here directly.
  f();
  const int hs = kC / kNH;
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < kNH; ++h) {
      for (int t = 0; t < kT; ++t) {
        double sum = 0;
        for (int u = 0; u <= t; ++u) {
          double s = 0;
          for (int d = 0; d < hs; ++d) {
            s += qkv[(static_cast<std::size_t>(b) * kT + t) * 3 * kC + h * hs + d] *
                 qkv[(static_cast<std::size_t>(b) * kT + u) * 3 * kC + kC + h * hs + d];
          }
          sum += std::exp(s / std::sqrt(static_cast<double>(hs)));
        }
        CHECK(lse[(static_cast<std::size_t>(b) * kNH + h) * kT + t] ==
              Approx(std::log(sum)).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("tied logits backward matches finite differences (float64)", "[fd]") {
  Vec x = normal_values(kSeed, 61, kN * kC);
  Vec wte = normal_values(kSeed, 62, kV * kC, 0.1);
  const Vec R = normal_values(kSeed, 63, kN * kV);
  Vec logits(kN * kV);
  auto f = [&] {
    logits_forward<double>(logits.data(), x.data(), wte.data(), kN, kC, kV, nullptr);
    return dot(logits, R);
  };
  Vec dx(x.size(), 0.0), dwte(wte.size(), 0.0);
  logits_backward<double, double>(dx.data(), dwte.data(), R.data(), x.data(), wte.data(), kN, kC,
                                  kV, nullptr);
  check_gradient("dinp", x, dx, f);
  check_gradient("dwte", wte, dwte, f);
}

TEST_CASE("cross-entropy backward matches finite differences (float64)", "[fd]") {
  Vec logits = normal_values(kSeed, 71, kN * kV, 2.0);
  const auto targets = test::token_values(kSeed, 72, kN, kV);
  const double dloss = 1.0 / kN;
  Vec losses(kN);
  auto f = [&] {
    crossentropy_forward<double>(losses.data(), logits.data(), targets.data(), kN, kV);
    double s = 0;
    for (double l : losses) s += l * dloss;
    return s;
  };
  Vec dlogits(logits.size(), 123.0);  // overwritten, not accumulated
  crossentropy_backward<double>(dlogits.data(), logits.data(), targets.data(), dloss, kN, kV);
  check_gradient("dlogits", logits, dlogits, f);
  const double total = f() / dloss;
  double mean = 0;
  loss_mean<double>(&mean, losses.data(), kN);
  CHECK(mean == Approx(total / kN).epsilon(1e-14));
}

namespace {
// The fused classifier against crossentropy_forward + crossentropy_backward: the same losses and
// dlogits, bit for bit (one computation of the same statistics), out of place and in place, on
// dense and padded rows (the padding of the input NaN, of dlogits zero afterwards).
template <typename S>
void check_fused_classifier(int ldl) {
  using A = acc_t<S>;
  const int V = kV - 6;  // an odd vocabulary inside the padded rows
  Vec values = normal_values(kSeed, 73, kN * ldl, 3.0);
  for (int n = 0; n < kN; ++n) {
    for (int v = V; v < ldl; ++v) values[static_cast<std::size_t>(n) * ldl + v] = std::nan("");
  }
  const auto logits = test::to_storage<S>(values);
  const auto targets = test::token_values(kSeed, 74, kN, V);
  const A dloss = A(1) / kN;
  std::vector<A> losses_ref(kN), losses(kN, A(-1)), losses_inplace(kN, A(-1));
  std::vector<S> dlogits_ref(logits.size()), dlogits(logits.size()), inplace = logits;
  crossentropy_forward<S>(losses_ref.data(), logits.data(), targets.data(), kN, V, ldl);
  crossentropy_backward<S>(dlogits_ref.data(), logits.data(), targets.data(), dloss, kN, V, ldl);
  crossentropy_forward_backward<S>(losses.data(), dlogits.data(), logits.data(), targets.data(),
                                   dloss, kN, V, ldl);
  crossentropy_forward_backward<S>(losses_inplace.data(), inplace.data(), inplace.data(),
                                   targets.data(), dloss, kN, V, ldl);
  CHECK(test::to_double(losses) == test::to_double(losses_ref));
  CHECK(test::to_double(losses_inplace) == test::to_double(losses_ref));
  CHECK(test::to_double(dlogits) == test::to_double(dlogits_ref));
  CHECK(test::to_double(inplace) == test::to_double(dlogits_ref));
  for (int n = 0; n < kN; ++n) {
    for (int v = V; v < ldl; ++v)
      CHECK(load<double>(inplace[static_cast<std::size_t>(n) * ldl + v]) == 0.0);
  }
  // Without a losses buffer it is crossentropy_backward.
  std::vector<S> no_losses(logits.size());
  crossentropy_forward_backward<S>(nullptr, no_losses.data(), logits.data(), targets.data(), dloss,
                                   kN, V, ldl);
  CHECK(test::to_double(no_losses) == test::to_double(dlogits_ref));
}
}  // namespace

TEST_CASE("the fused classifier gives crossentropy_forward + _backward bit for bit", "[fd]") {
  for (int ldl : {kV - 6, kV}) {
    INFO("row stride " << ldl);
    check_fused_classifier<double>(ldl);
    check_fused_classifier<float>(ldl);
    check_fused_classifier<bf16>(ldl);
    check_fused_classifier<fp16>(ldl);
  }
  std::vector<float> logits(2 * 4, 0.0f), losses(2);
  std::vector<std::int32_t> targets = {0, 4};
  CHECK_THROWS_AS(crossentropy_forward_backward<float>(losses.data(), logits.data(), logits.data(),
                                                       targets.data(), 0.5f, 2, 4),
                  InvalidArgument);
}

namespace {
// matmul_backward / linear_backward with GradWrite::kOverwrite into a dinp full of NaN against
// the default accumulation into zeros: the same bits (one rounding of the same fp32 sum either
// way), while dweight and dbias still accumulate.
template <typename S, typename G>
void check_overwrite(bool linear) {
  const int N = kN, C = kC, OC = 2 * kC;
  const auto x = test::to_storage<S>(normal_values(kSeed, 91, N * C));
  const auto w = test::to_storage<S>(normal_values(kSeed, 92, C * OC, 0.1));
  const auto dy = test::to_storage<S>(normal_values(kSeed, 93, N * OC));
  const auto g0 = test::to_storage<G>(normal_values(kSeed, 94, C * OC + OC));
  std::vector<float> ws(static_cast<std::size_t>(matmul_backward_workspace<S>(N, C, OC)) + 1);
  auto run = [&](std::vector<S>& dx, std::vector<G>& dw, std::vector<G>& db, GradWrite mode) {
    auto* wsp = reinterpret_cast<acc_t<S>*>(ws.data());
    if (linear) {
      linear_backward<S, G>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C,
                            OC, wsp, mode);
    } else {
      matmul_backward<S, G>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C,
                            OC, wsp, mode);
    }
  };
  std::vector<S> dx_acc = test::to_storage<S>(Vec(N * C, 0.0));
  std::vector<S> dx_over = test::to_storage<S>(Vec(N * C, std::nan("")));
  std::vector<G> dw_acc(g0.begin(), g0.begin() + C * OC), dw_over = dw_acc;
  std::vector<G> db_acc(g0.begin() + C * OC, g0.end()), db_over = db_acc;
  run(dx_acc, dw_acc, db_acc, GradWrite::kAccumulate);
  run(dx_over, dw_over, db_over, GradWrite::kOverwrite);
  CHECK(test::to_double(dx_over) == test::to_double(dx_acc));
  CHECK(test::to_double(dw_over) == test::to_double(dw_acc));
  CHECK(test::to_double(db_over) == test::to_double(db_acc));
  // And dweight accumulated onto its start: a second pass adds again.
  std::vector<G> dw_start(g0.begin(), g0.begin() + C * OC);
  CHECK(test::to_double(dw_over) != test::to_double(dw_start));
}
}  // namespace

TEST_CASE("GradWrite::kOverwrite writes dinp as accumulating into zeros does", "[fd]") {
  for (bool linear : {false, true}) {
    INFO((linear ? "linear_backward" : "matmul_backward"));
    check_overwrite<double, double>(linear);
    check_overwrite<float, float>(linear);
    check_overwrite<bf16, bf16>(linear);
    check_overwrite<bf16, float>(linear);
    check_overwrite<fp16, float>(linear);
  }
}

TEST_CASE("parameter and input gradients accumulate", "[fd]") {
  const int OC = 2 * kC;
  const Vec x = normal_values(kSeed, 81, kN * kC);
  const Vec w = normal_values(kSeed, 82, kC * OC, 0.1);
  const Vec R = normal_values(kSeed, 83, kN * OC);
  Vec dx1(x.size(), 0.0), dw1(w.size(), 0.0), db1(OC, 0.0);
  matmul_backward<double, double>(dx1.data(), dw1.data(), db1.data(), R.data(), x.data(), w.data(),
                                  kN, kC, OC, nullptr);
  Vec dx2 = dx1, dw2 = dw1, db2 = db1;
  matmul_backward<double, double>(dx2.data(), dw2.data(), db2.data(), R.data(), x.data(), w.data(),
                                  kN, kC, OC, nullptr);
  for (std::size_t i = 0; i < dx1.size(); ++i) CHECK(dx2[i] == Approx(2 * dx1[i]).epsilon(1e-12));
  for (std::size_t i = 0; i < dw1.size(); ++i) CHECK(dw2[i] == Approx(2 * dw1[i]).epsilon(1e-12));
  for (std::size_t i = 0; i < db1.size(); ++i) CHECK(db2[i] == Approx(2 * db1[i]).epsilon(1e-12));

  const Vec lx = normal_values(kSeed, 84, kN * kC);
  const Vec lw = normal_values(kSeed, 85, kC, 0.1, 1.0);
  const Vec lb(kC, 0.0);
  Vec out(kN * kC), mean(kN), rstd(kN);
  layernorm_forward<double>(out.data(), mean.data(), rstd.data(), lx.data(), lw.data(), lb.data(),
                            kN, kC);
  const Vec dy = normal_values(kSeed, 86, kN * kC);
  Vec ldx(lx.size(), 1.0), ldw(kC, 1.0), ldb(kC, 1.0);
  Vec zdx(lx.size(), 0.0), zdw(kC, 0.0), zdb(kC, 0.0);
  layernorm_backward<double, double>(ldx.data(), ldw.data(), ldb.data(), dy.data(), lx.data(),
                                     lw.data(), mean.data(), rstd.data(), kN, kC);
  layernorm_backward<double, double>(zdx.data(), zdw.data(), zdb.data(), dy.data(), lx.data(),
                                     lw.data(), mean.data(), rstd.data(), kN, kC);
  for (std::size_t i = 0; i < ldx.size(); ++i) CHECK(ldx[i] == Approx(1.0 + zdx[i]).epsilon(1e-12));
  for (int c = 0; c < kC; ++c) {
    CHECK(ldw[c] == Approx(1.0 + zdw[c]).epsilon(1e-12));
    CHECK(ldb[c] == Approx(1.0 + zdb[c]).epsilon(1e-12));
  }
}

TEST_CASE("out-of-range token ids are rejected", "[fd]") {
  std::vector<double> wte(4 * 2, 0.0), wpe(2 * 2, 0.0), out(2 * 2);
  std::vector<std::int32_t> tokens = {1, 4};
  CHECK_THROWS_AS(
      encoder_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), 1, 2, 2, 4),
      InvalidArgument);
  std::vector<double> logits(2 * 4, 0.0), losses(2);
  std::vector<std::int32_t> targets = {-1, 0};
  CHECK_THROWS_AS(crossentropy_forward<double>(losses.data(), logits.data(), targets.data(), 2, 4),
                  InvalidArgument);
}

}  // namespace
}  // namespace zrt::kernels::cpu
