// Finite-difference gradient checks in float64 of every layer's backward (the CPU twins
// instantiated with double), at the tiny GPT's widths (C = 64, 4 heads, V = 256). Each check
// takes L = sum(out * R) for a fixed random R, compares the analytic gradient of every input
// and parameter against central differences on (up to ~1500 sampled) elements. Then packed
// documents (kernels/ops.h: doc_start, positions, targets < 0): the gradients with them, a packed
// call against each document run alone, no leak across a boundary, null against one document.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/documents.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/grouped_linear.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "tests/kernels/attention_order_bounds.h"
#include "tests/kernels/fd_check.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::kernels::cpu {
namespace {

using test::check_gradient;
using test::check_within;
using test::dot;
using test::normal_values;
using test::order_bounds;
using test::OrderBounds;
using test::spacing_of;
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

namespace {
// A null dweight (a frozen weight): the GEMM is skipped, and dinp and dbias are the bits the
// call with a dweight gives.
template <typename S, typename G>
void check_null_weight_grad(bool linear) {
  const int N = kN, C = kC, OC = 2 * kC;
  const auto x = test::to_storage<S>(normal_values(kSeed, 95, N * C));
  const auto w = test::to_storage<S>(normal_values(kSeed, 96, C * OC, 0.1));
  const auto dy = test::to_storage<S>(normal_values(kSeed, 97, N * OC));
  std::vector<float> ws(static_cast<std::size_t>(matmul_backward_workspace<S>(N, C, OC)) + 1);
  auto run = [&](std::vector<S>& dx, G* dw, std::vector<G>& db) {
    auto* wsp = reinterpret_cast<acc_t<S>*>(ws.data());
    if (linear) {
      linear_backward<S, G>(dx.data(), dw, db.data(), dy.data(), x.data(), w.data(), N, C, OC, wsp);
    } else {
      matmul_backward<S, G>(dx.data(), dw, db.data(), dy.data(), x.data(), w.data(), N, C, OC, wsp);
    }
  };
  std::vector<S> dx_full = test::to_storage<S>(Vec(N * C, 0.0)), dx_null = dx_full;
  std::vector<G> dw(static_cast<std::size_t>(C) * OC, G{});
  std::vector<G> db_full(OC, G{}), db_null(OC, G{});
  run(dx_full, dw.data(), db_full);
  run(dx_null, nullptr, db_null);
  CHECK(test::to_double(dx_null) == test::to_double(dx_full));
  CHECK(test::to_double(db_null) == test::to_double(db_full));
  CHECK(test::to_double(dw) != test::to_double(std::vector<G>(dw.size(), G{})));
}
}  // namespace

TEST_CASE("a null weight gradient skips its GEMM and leaves dinp and dbias as they were",
          "[fd][frozen]") {
  for (bool linear : {false, true}) {
    INFO((linear ? "linear_backward" : "matmul_backward"));
    check_null_weight_grad<double, double>(linear);
    check_null_weight_grad<float, float>(linear);
    check_null_weight_grad<bf16, bf16>(linear);
    check_null_weight_grad<bf16, float>(linear);
    check_null_weight_grad<fp16, float>(linear);
  }
  // The tied head: dinp alone.
  const Vec x = normal_values(kSeed, 64, kN * kC);
  const Vec wte = normal_values(kSeed, 65, kV * kC, 0.1);
  const Vec R = normal_values(kSeed, 66, kN * kV);
  Vec dx_full(x.size(), 0.0), dx_null(x.size(), 0.0), dwte(wte.size(), 0.0);
  logits_backward<double, double>(dx_full.data(), dwte.data(), R.data(), x.data(), wte.data(), kN,
                                  kC, kV, nullptr);
  logits_backward<double, double>(dx_null.data(), nullptr, R.data(), x.data(), wte.data(), kN, kC,
                                  kV, nullptr);
  CHECK(dx_null == dx_full);
  // A mixture's frozen experts: the grouped GEMMs' dinp alone (three experts, one without rows).
  const std::vector<std::int32_t> offsets = {0, 5, 5, kN};
  const Vec ew = normal_values(kSeed, 67, 3 * kC * kC, 0.1);
  const Vec edout = normal_values(kSeed, 68, kN * kC);
  Vec edx_full(x.size(), 0.0), edx_null(x.size(), 0.0), edw(ew.size(), 0.0);
  grouped_linear_backward<double, double>(edx_full.data(), edw.data(), edout.data(), x.data(),
                                          ew.data(), offsets.data(), 3, kC, kC, nullptr);
  grouped_linear_backward<double, double>(edx_null.data(), nullptr, edout.data(), x.data(),
                                          ew.data(), offsets.data(), 3, kC, kC, nullptr);
  CHECK(edx_null == edx_full);
  CHECK(edw != Vec(ew.size(), 0.0));
  // A frozen token table: the positions' sums alone.
  const std::vector<std::int32_t> tokens = test::token_values(kSeed, 69, kB * kT, kV);
  const Vec dout = normal_values(kSeed, 70, kB * kT * kC);
  Vec etok(kV * kC, 0.0), dwpe_full(kT * kC, 0.0), dwpe_null(kT * kC, 0.0);
  encoder_backward<double, double>(etok.data(), dwpe_full.data(), dout.data(), tokens.data(), kB,
                                   kT, kC, kV, nullptr, 0);
  encoder_backward<double, double>(nullptr, dwpe_null.data(), dout.data(), tokens.data(), kB, kT,
                                   kC, kV, nullptr, 0);
  CHECK(dwpe_null == dwpe_full);
  CHECK(etok != Vec(etok.size(), 0.0));
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
  // A frozen weight, bias or both (null gradients): the others and dinp as with all three.
  for (const auto& [weight, bias] :
       {std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
    INFO("dweight " << (weight ? "set" : "null") << ", dbias " << (bias ? "set" : "null"));
    Vec fdx(lx.size(), 0.0), fdw(kC, 0.0), fdb(kC, 0.0);
    layernorm_backward<double, double>(fdx.data(), weight ? fdw.data() : nullptr,
                                       bias ? fdb.data() : nullptr, dy.data(), lx.data(), lw.data(),
                                       mean.data(), rstd.data(), kN, kC);
    CHECK(fdx == zdx);
    CHECK(fdw == (weight ? zdw : Vec(kC, 0.0)));
    CHECK(fdb == (bias ? zdb : Vec(kC, 0.0)));
  }
}

TEST_CASE("out-of-range token ids are rejected", "[fd]") {
  std::vector<double> wte(4 * 2, 0.0), wpe(2 * 2, 0.0), out(2 * 2);
  std::vector<std::int32_t> tokens = {1, 4};
  CHECK_THROWS_AS(
      encoder_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), 1, 2, 2, 4),
      InvalidArgument);
  std::vector<double> logits(2 * 4, 0.0), losses(2);
  std::vector<std::int32_t> targets = {4, 0};  // a target < 0 is a masked row, not an error
  CHECK_THROWS_AS(crossentropy_forward<double>(losses.data(), logits.data(), targets.data(), 2, 4),
                  InvalidArgument);
}

// ---- Packed documents ------------------------------------------------------------------------

// Gradients with doc_start, and each row's log-sum-exp over its own document only: sequence 0
// holds documents of 1, 4, 1 and 2 tokens, sequence 1 one of 8.
TEST_CASE("attention with packed documents matches finite differences (float64)", "[fd][docs]") {
  const test::Packing pack = test::pack_documents({{1, 4, 1, 2}, {8}}, kT);
  const std::int32_t* ds = pack.doc_start.data();
  Vec qkv = normal_values(kSeed, 151, kN * 3 * kC);
  const Vec R = normal_values(kSeed, 152, kN * kC);
  Vec out(kN * kC), lse(static_cast<std::size_t>(kB) * kNH * kT);
  Vec ws(static_cast<std::size_t>(std::max(attention_forward_workspace<double>(kB, kT, kC, kNH),
                                           attention_backward_workspace<double>(kB, kT, kC, kNH))));
  auto f = [&] {
    attention_forward<double>(out.data(), lse.data(), qkv.data(), kB, kT, kC, kNH, ws.data(), ds);
    return dot(out, R);
  };
  f();
  Vec dqkv(qkv.size(), 0.0);
  attention_backward<double>(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), kB, kT, kC,
                             kNH, ws.data(), ds);
  check_gradient("dqkv", qkv, dqkv, f);
  f();
  const int hs = kC / kNH;
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < kNH; ++h) {
      for (int t = 0; t < kT; ++t) {
        double sum = 0;
        for (int u = ds[b * kT + t]; u <= t; ++u) {
          double sc = 0;
          for (int d = 0; d < hs; ++d) {
            sc += qkv[(static_cast<std::size_t>(b) * kT + t) * 3 * kC + h * hs + d] *
                  qkv[(static_cast<std::size_t>(b) * kT + u) * 3 * kC + kC + h * hs + d];
          }
          sum += std::exp(sc / std::sqrt(static_cast<double>(hs)));
        }
        CHECK(lse[(static_cast<std::size_t>(b) * kNH + h) * kT + t] ==
              Approx(std::log(sum)).epsilon(1e-12));
      }
    }
  }
  // A doc_start that is no packing of whole documents is refused.
  std::vector<std::int32_t> bad = pack.doc_start;
  bad[3] = 2;  // token 3 of the document starting at 1, claiming a start at 2
  CHECK_THROWS_AS(attention_forward<double>(out.data(), lse.data(), qkv.data(), kB, kT, kC, kNH,
                                            ws.data(), bad.data()),
                  InvalidArgument);
}

TEST_CASE("encoder with positions matches finite differences (float64)", "[fd][docs]") {
  const test::Packing pack = test::pack_documents({{3, 5}, {1, 6, 1}}, kT);
  Vec wte = normal_values(kSeed, 161, kV * kC);
  Vec wpe = normal_values(kSeed, 162, kT * kC);
  const Vec R = normal_values(kSeed, 163, kN * kC);
  const auto tokens = test::token_values(kSeed, 164, kN, kV);
  const std::int32_t* pos = pack.positions.data();
  Vec out(kN * kC);
  auto f = [&] {
    encoder_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC, kV, pos);
    return dot(out, R);
  };
  f();
  // Row (b=1, t=2) is position 1 of its document: wpe row 1, not 2.
  const std::size_t r = 1 * kT + 2;
  CHECK(out[r * kC + 5] == wte[tokens[r] * kC + 5] + wpe[1 * kC + 5]);
  Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  encoder_backward<double, double>(dwte.data(), dwpe.data(), R.data(), tokens.data(), kB, kT, kC,
                                   kV, pos);
  check_gradient("dwte", wte, dwte, f);
  check_gradient("dwpe", wpe, dwpe, f);
  // The longest document has 6 tokens: rows 6 and 7 of wpe are read by no token.
  for (int c = 0; c < kC; ++c) {
    CHECK(dwpe[6 * kC + c] == 0.0);
    CHECK(dwpe[7 * kC + c] == 0.0);
  }
  std::vector<std::int32_t> bad = pack.positions;
  bad[4] = kT;  // past the position table
  CHECK_THROWS_AS(encoder_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT,
                                          kC, kV, bad.data()),
                  InvalidArgument);
}

// A sequence-parallel chunk of T tokens at offset T in a sequence of 2T reads and trains wpe rows
// T..2T-1 of a table of 2T rows (position_rows); a position past the table is still refused.
TEST_CASE("encoder: a chunk's positions index a position table longer than the chunk", "[fd][sp]") {
  const int P = 2 * kT;
  const Vec wte = normal_values(kSeed, 171, kV * kC);
  const Vec wpe = normal_values(kSeed, 172, P * kC);
  const Vec dout = normal_values(kSeed, 173, kN * kC);
  const auto tokens = test::token_values(kSeed, 174, kN, kV);
  std::vector<std::int32_t> pos(kN);
  for (int r = 0; r < kN; ++r) pos[r] = kT + r % kT;
  Vec out(kN * kC);
  encoder_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC, kV,
                          pos.data(), P);
  Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  encoder_backward<double, double>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), kB, kT, kC,
                                   kV, pos.data(), P);
  for (int r = 0; r < kN; ++r) {
    for (int c = 0; c < kC; ++c) {
      CHECK(out[r * kC + c] == wte[tokens[r] * kC + c] + wpe[pos[r] * kC + c]);
    }
  }
  for (int p = 0; p < P; ++p) {
    for (int c = 0; c < kC; ++c) {
      double want = 0.0;
      for (int b = 0; b < kB; ++b) {
        if (p >= kT) want += dout[(b * kT + p - kT) * kC + c];
      }
      CHECK(dwpe[p * kC + c] == Approx(want).epsilon(1e-12));
    }
  }
  pos[3] = P;
  CHECK_THROWS_AS(encoder_forward<double>(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT,
                                          kC, kV, pos.data(), P),
                  InvalidArgument);
}

// Rows with targets < 0 are out of the loss: loss 0, gradient row 0 (padding included), and the
// others exactly what the unmasked call gives them (each row is computed on its own); the mean
// over a divisor, and the finite differences of the masked loss.
TEST_CASE("cross-entropy leaves out targets < 0; loss_mean divides by its divisor", "[fd][docs]") {
  auto check = [](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    const int V = kV - 6, ldl = kV;
    const auto logits = test::to_storage<S>(normal_values(kSeed, 171, kN * ldl, 3.0));
    const auto full = test::token_values(kSeed, 172, kN, V);
    std::vector<std::int32_t> masked = full;
    for (int n : {0, 3, 4, 11, kN - 1}) masked[n] = -1 - n % 2;  // -1 and -2 alike
    const A dloss = A(1) / kN;
    std::vector<A> l_full(kN), l_masked(kN, A(7)), l_fused(kN, A(7));
    std::vector<S> d_full(logits.size()), d_masked(logits.size()), d_fused = logits;
    crossentropy_forward<S>(l_full.data(), logits.data(), full.data(), kN, V, ldl);
    crossentropy_backward<S>(d_full.data(), logits.data(), full.data(), dloss, kN, V, ldl);
    crossentropy_forward<S>(l_masked.data(), logits.data(), masked.data(), kN, V, ldl);
    crossentropy_backward<S>(d_masked.data(), logits.data(), masked.data(), dloss, kN, V, ldl);
    crossentropy_forward_backward<S>(l_fused.data(), d_fused.data(), d_fused.data(), masked.data(),
                                     dloss, kN, V, ldl);  // in place
    for (int n = 0; n < kN; ++n) {
      INFO("row " << n << ", target " << masked[n]);
      const bool out = masked[n] < 0;
      CHECK(l_masked[n] == (out ? A(0) : l_full[n]));
      CHECK(l_fused[n] == l_masked[n]);
      for (int v = 0; v < ldl; ++v) {
        const std::size_t i = static_cast<std::size_t>(n) * ldl + v;
        const double want = out ? 0.0 : load<double>(d_full[i]);
        CHECK(load<double>(d_masked[i]) == want);
        CHECK(load<double>(d_fused[i]) == want);
      }
    }
    // The mean over the loss tokens: the same double sum in index order, over the divisor.
    double sum = 0;
    for (int n = 0; n < kN; ++n) sum += static_cast<double>(l_masked[n]);
    A mean = 0, over = 0;
    loss_mean<A>(&mean, l_masked.data(), kN);
    loss_mean<A>(&over, l_masked.data(), kN, 11.0f);
    CHECK(mean == static_cast<A>(sum / kN));
    CHECK(over == static_cast<A>(sum / 11.0));
  };
  check(double{});
  check(float{});
  check(bf16{});
  check(fp16{});

  // d/dlogits of sum over the loss rows of loss * dloss, by finite differences.
  Vec logits = normal_values(kSeed, 173, kN * kV, 2.0);
  auto targets = test::token_values(kSeed, 174, kN, kV);
  targets[2] = -1;
  targets[9] = -1;
  const double dloss = 1.0 / (kN - 2);
  Vec losses(kN);
  auto f = [&] {
    crossentropy_forward<double>(losses.data(), logits.data(), targets.data(), kN, kV);
    double sum = 0;
    for (double l : losses) sum += l * dloss;
    return sum;
  };
  Vec dlogits(logits.size(), 123.0);
  crossentropy_backward<double>(dlogits.data(), logits.data(), targets.data(), dloss, kN, kV);
  check_gradient("dlogits", logits, dlogits, f);
}

namespace {

// Packed-vs-separate shapes: two sequences of T = 150 (no multiple of 64). Sequence 0: a 1-token
// document, one of 80 across the 64-token tile boundary (tokens 1..80), another 1-token one, 37
// and 31; sequence 1: 70 and 80. Head size 16.
constexpr int kPB = 2, kPT = 150, kPC = 32, kPNH = 2;
test::Packing packed_layout() {
  return test::pack_documents({{1, 80, 1, 37, 31}, {70, 80}}, kPT);
}

// Rows [begin, begin + length) of sequence b of a (B, T, width) tensor.
template <typename X>
std::vector<X> rows_of(const std::vector<X>& x, int T, int width, int b, int begin, int length) {
  const auto first = x.begin() + (static_cast<std::ptrdiff_t>(b) * T + begin) * width;
  return std::vector<X>(first, first + static_cast<std::ptrdiff_t>(length) * width);
}

// The (NH, length) rows of sequence b's statistics in a (B, NH, T) tensor.
template <typename X>
std::vector<X> stat_rows(const std::vector<X>& x, int NH, int T, int b, int begin, int length) {
  std::vector<X> out;
  for (int h = 0; h < NH; ++h) {
    const auto first = x.begin() + (static_cast<std::ptrdiff_t>(b) * NH + h) * T + begin;
    out.insert(out.end(), first, first + length);
  }
  return out;
}

template <typename S>
struct AttentionRun {
  std::vector<S> out, dqkv;
  std::vector<acc_t<S>> lse;
};

// The CPU twin's forward and backward (dqkv from zero).
template <typename S>
AttentionRun<S> run_attention(const std::vector<S>& qkv, const std::vector<S>& dout, int B, int T,
                              int C, int NH, const std::int32_t* doc_start) {
  using A = acc_t<S>;
  std::vector<A> ws(
      static_cast<std::size_t>(std::max(attention_forward_workspace<S>(B, T, C, NH),
                                        attention_backward_workspace<S>(B, T, C, NH))) +
      1);
  AttentionRun<S> r{std::vector<S>(dout.size()), test::to_storage<S>(Vec(qkv.size(), 0.0)),
                    std::vector<A>(static_cast<std::size_t>(B) * NH * T)};
  attention_forward<S>(r.out.data(), r.lse.data(), qkv.data(), B, T, C, NH, ws.data(), doc_start);
  attention_backward<S>(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), B, T, C,
                        NH, ws.data(), doc_start);
  return r;
}

// Packed (both sequences in one call, with doc_start) against each document run alone as its own
// sequence (B = 1, T = its length, no doc_start): out, lse and dqkv per document.
template <typename S>
void check_packed_equals_separate() {
  using A = acc_t<S>;
  const test::Packing pack = packed_layout();
  const Vec qkv_values = normal_values(kSeed, 181, kPB * kPT * 3 * kPC);
  const Vec dout_values = normal_values(kSeed, 182, kPB * kPT * kPC);
  const auto qkv = test::to_storage<S>(qkv_values);
  const auto dout = test::to_storage<S>(dout_values);
  const AttentionRun<S> packed =
      run_attention<S>(qkv, dout, kPB, kPT, kPC, kPNH, pack.doc_start.data());
  const double u = std::is_same_v<A, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  for (const auto& doc : pack.spans) {
    INFO("document of sequence " << doc.b << " at " << doc.begin << ", " << doc.length
                                 << " tokens");
    const auto dq = rows_of(qkv, kPT, 3 * kPC, doc.b, doc.begin, doc.length);
    const auto dy = rows_of(dout, kPT, kPC, doc.b, doc.begin, doc.length);
    const AttentionRun<S> alone = run_attention<S>(dq, dy, 1, doc.length, kPC, kPNH, nullptr);
    const OrderBounds bound = order_bounds(test::to_double(dq), test::to_double(dy), doc.length,
                                           kPC, kPNH, u, spacing_of<S>());
    check_within("out",
                 test::to_double(rows_of(packed.out, kPT, kPC, doc.b, doc.begin, doc.length)),
                 test::to_double(alone.out), bound.out);
    check_within("lse",
                 test::to_double(stat_rows(packed.lse, kPNH, kPT, doc.b, doc.begin, doc.length)),
                 test::to_double(alone.lse), bound.lse);
    check_within("dqkv",
                 test::to_double(rows_of(packed.dqkv, kPT, 3 * kPC, doc.b, doc.begin, doc.length)),
                 test::to_double(alone.dqkv), bound.dqkv);
  }
}

}  // namespace

TEST_CASE("packed attention equals each document run alone", "[docs]") {
  SECTION("float64") {
    check_packed_equals_separate<double>();
  }
  SECTION("fp32") {
    check_packed_equals_separate<float>();
  }
  SECTION("bf16") {
    check_packed_equals_separate<bf16>();
  }
  SECTION("fp16") {
    check_packed_equals_separate<fp16>();
  }
}

namespace {
// Changes token `t` of sequence `b` (its q, k, v in every head, and its dout) and runs again: the
// documents other than t's must give the same out, lse and dqkv, bit for bit, while t's change.
template <typename S>
void check_no_leak() {
  const test::Packing pack = packed_layout();
  const Vec qkv_values = normal_values(kSeed, 191, kPB * kPT * 3 * kPC);
  const Vec dout_values = normal_values(kSeed, 192, kPB * kPT * kPC);
  const auto base =
      run_attention<S>(test::to_storage<S>(qkv_values), test::to_storage<S>(dout_values), kPB, kPT,
                       kPC, kPNH, pack.doc_start.data());
  for (const int t : {1, 40, 80}) {  // the first, a middle and the last token of document [1, 81)
    INFO("token " << t << " of sequence 0 changed");
    Vec qkv2 = qkv_values, dout2 = dout_values;
    for (int c = 0; c < 3 * kPC; ++c) qkv2[static_cast<std::size_t>(t) * 3 * kPC + c] += 3.0;
    for (int c = 0; c < kPC; ++c) dout2[static_cast<std::size_t>(t) * kPC + c] -= 2.0;
    const auto changed = run_attention<S>(test::to_storage<S>(qkv2), test::to_storage<S>(dout2),
                                          kPB, kPT, kPC, kPNH, pack.doc_start.data());
    for (const auto& doc : pack.spans) {
      const bool own = doc.b == 0 && doc.begin <= t && t < doc.begin + doc.length;
      INFO("document of sequence " << doc.b << " at " << doc.begin);
      auto same = [&](const auto& x, const auto& y, int width) {
        return test::to_double(rows_of(x, kPT, width, doc.b, doc.begin, doc.length)) ==
               test::to_double(rows_of(y, kPT, width, doc.b, doc.begin, doc.length));
      };
      const bool lse_same =
          test::to_double(stat_rows(base.lse, kPNH, kPT, doc.b, doc.begin, doc.length)) ==
          test::to_double(stat_rows(changed.lse, kPNH, kPT, doc.b, doc.begin, doc.length));
      if (own) {
        CHECK_FALSE(same(base.dqkv, changed.dqkv, 3 * kPC));  // the change is seen where it is
      } else {
        CHECK(same(base.out, changed.out, kPC));
        CHECK(lse_same);
        CHECK(same(base.dqkv, changed.dqkv, 3 * kPC));
      }
    }
  }
}

// doc_start null against one explicit document per sequence (all zeros): the same calls, the
// same bits.
template <typename S>
void check_one_document_is_null() {
  const int B = 2, T = 70, C = 32, NH = 2;
  const auto qkv = test::to_storage<S>(normal_values(kSeed, 195, B * T * 3 * C));
  const auto dout = test::to_storage<S>(normal_values(kSeed, 196, B * T * C));
  const std::vector<std::int32_t> zeros(static_cast<std::size_t>(B) * T, 0);
  const auto null = run_attention<S>(qkv, dout, B, T, C, NH, nullptr);
  const auto one = run_attention<S>(qkv, dout, B, T, C, NH, zeros.data());
  CHECK(test::to_double(one.out) == test::to_double(null.out));
  CHECK(test::to_double(one.lse) == test::to_double(null.lse));
  CHECK(test::to_double(one.dqkv) == test::to_double(null.dqkv));
}
}  // namespace

TEST_CASE("attention never reads across a document boundary", "[docs]") {
  check_no_leak<float>();
  check_no_leak<bf16>();
}

TEST_CASE("attention with one document per sequence is attention without doc_start", "[docs]") {
  check_one_document_is_null<float>();
  check_one_document_is_null<bf16>();
  check_one_document_is_null<double>();
}

namespace {
// The encoder with positions against each document run alone (positions 0..L-1 of its own, no
// positions argument): out bit for bit (one addition per element either way); dwte and dwpe sum
// the same rows in another order (packed: each id's rows in (b,t) order, then one addition;
// separate: a sum per document added in turn), so per element within twice g(n + k) times the
// sum of |terms|, n rows and k documents sharing the id, doubled for second-order terms; G = S,
// so 16-bit gradients add one spacing per addition (k + 1 of them).
template <typename S>
void check_encoder_packed_equals_separate() {
  using A = acc_t<S>;
  const test::Packing pack = packed_layout();
  const int C = kPC, V = 40, N = kPB * kPT;
  const Vec wte_values = normal_values(kSeed, 201, V * C);
  const Vec wpe_values = normal_values(kSeed, 202, kPT * C);
  const Vec dout_values = normal_values(kSeed, 203, N * C);
  const auto wte = test::to_storage<S>(wte_values), wpe = test::to_storage<S>(wpe_values),
             dout = test::to_storage<S>(dout_values);
  const auto tokens = test::token_values(kSeed, 204, N, V);
  auto zeros = [](std::size_t n) { return test::to_storage<S>(Vec(n, 0.0)); };
  std::vector<S> out(static_cast<std::size_t>(N) * C);
  std::vector<S> dwte = zeros(wte.size()), dwpe = zeros(wpe.size());
  encoder_forward<S>(out.data(), tokens.data(), wte.data(), wpe.data(), kPB, kPT, C, V,
                     pack.positions.data());
  encoder_backward<S, S>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), kPB, kPT, C, V,
                         pack.positions.data());
  std::vector<S> sep_dwte = zeros(wte.size()), sep_dwpe = zeros(wpe.size());
  // Per id: rows n, documents k, and sum |dout| (the terms) for the bounds.
  std::vector<int> wte_rows(V), wte_docs(V), wpe_rows(kPT), wpe_docs(kPT);
  Vec wte_mag(static_cast<std::size_t>(V) * C), wpe_mag(static_cast<std::size_t>(kPT) * C);
  for (const auto& doc : pack.spans) {
    const auto tok = rows_of(tokens, kPT, 1, doc.b, doc.begin, doc.length);
    const auto dy = rows_of(dout, kPT, C, doc.b, doc.begin, doc.length);
    std::vector<S> alone(static_cast<std::size_t>(doc.length) * C);
    encoder_forward<S>(alone.data(), tok.data(), wte.data(), wpe.data(), 1, doc.length, C, V);
    INFO("document of sequence " << doc.b << " at " << doc.begin);
    CHECK(test::to_double(rows_of(out, kPT, C, doc.b, doc.begin, doc.length)) ==
          test::to_double(alone));
    encoder_backward<S, S>(sep_dwte.data(), sep_dwpe.data(), dy.data(), tok.data(), 1, doc.length,
                           C, V);
    std::vector<char> seen_tok(V, 0);
    for (int i = 0; i < doc.length; ++i) {
      wte_rows[tok[i]] += 1;
      wte_docs[tok[i]] += seen_tok[tok[i]] ? 0 : 1;
      seen_tok[tok[i]] = 1;
      wpe_rows[i] += 1;
      wpe_docs[i] += 1;
      for (int c = 0; c < C; ++c) {
        const double m = std::abs(load<double>(dy[static_cast<std::size_t>(i) * C + c]));
        wte_mag[static_cast<std::size_t>(tok[i]) * C + c] += m;
        wpe_mag[static_cast<std::size_t>(i) * C + c] += m;
      }
    }
  }
  const double u = std::is_same_v<A, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  auto g = [u](double n) { return n * u / (1 - n * u); };
  auto bounds = [&](const std::vector<int>& rows, const std::vector<int>& docs, const Vec& mag,
                    const std::vector<S>& got) {
    Vec b(mag.size());
    for (std::size_t i = 0; i < b.size(); ++i) {
      const std::size_t id = i / C;
      const double x = std::abs(load<double>(got[i]));
      b[i] = 4 * g(rows[id] + docs[id]) * mag[i] + (docs[id] + 1) * spacing_of<S>() * (mag[i] + x) +
             1e-300;
    }
    return b;
  };
  check_within("dwte", test::to_double(dwte), test::to_double(sep_dwte),
               bounds(wte_rows, wte_docs, wte_mag, dwte));
  check_within("dwpe", test::to_double(dwpe), test::to_double(sep_dwpe),
               bounds(wpe_rows, wpe_docs, wpe_mag, dwpe));
  // Positions 0..T-1 are the unpacked encoder, bit for bit.
  std::vector<std::int32_t> identity(static_cast<std::size_t>(N));
  for (int i = 0; i < N; ++i) identity[i] = i % kPT;
  std::vector<S> out_null(out.size()), out_id(out.size());
  std::vector<S> dwte_null = zeros(wte.size()), dwpe_null = zeros(wpe.size());
  std::vector<S> dwte_id = dwte_null, dwpe_id = dwpe_null;
  encoder_forward<S>(out_null.data(), tokens.data(), wte.data(), wpe.data(), kPB, kPT, C, V);
  encoder_forward<S>(out_id.data(), tokens.data(), wte.data(), wpe.data(), kPB, kPT, C, V,
                     identity.data());
  encoder_backward<S, S>(dwte_null.data(), dwpe_null.data(), dout.data(), tokens.data(), kPB, kPT,
                         C, V);
  encoder_backward<S, S>(dwte_id.data(), dwpe_id.data(), dout.data(), tokens.data(), kPB, kPT, C, V,
                         identity.data());
  CHECK(test::to_double(out_id) == test::to_double(out_null));
  CHECK(test::to_double(dwte_id) == test::to_double(dwte_null));
  CHECK(test::to_double(dwpe_id) == test::to_double(dwpe_null));
}
}  // namespace

TEST_CASE("encoder with positions equals each document run alone", "[docs]") {
  check_encoder_packed_equals_separate<double>();
  check_encoder_packed_equals_separate<float>();
  check_encoder_packed_equals_separate<bf16>();
}

}  // namespace
}  // namespace zrt::kernels::cpu
