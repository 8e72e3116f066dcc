// The mixture-of-experts kernels (kernels/moe_ops.h) on the CPU: the CPU twins instantiated with
// double against float64 definitions (tests/kernels/moe_test_support.h) and central finite
// differences of every backward; the ops with fp32, bf16 and fp16 storage on a CPU context
// against those definitions, at tolerances from the arithmetic; the degenerate routings (all
// tokens to one expert, experts without tokens, slots routed nowhere, k = 1, k = E); ties; and
// determinism (two runs, and two thread counts, bit for bit).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/grouped_linear.h"
#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/moe_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/fd_check.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/moe_test_support.h"

namespace zrt::kernels {
namespace {

using test::check_gradient;
using test::dot;
using test::Ids;
using test::MoeBackend;
using test::normal_values;
using test::Vec;

constexpr std::uint64_t kSeed = 7301;

double max_abs_diff(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// ---- float64 twins against the definitions and finite differences ----

TEST_CASE("moe router forward matches its definition (float64)", "[moe][router]") {
  const int N = 13;
  for (auto [E, k, renormalize] :
       {std::tuple{8, 2, true}, std::tuple{6, 2, false}, std::tuple{5, 1, true},
        std::tuple{5, 1, false}, std::tuple{4, 4, true}, std::tuple{4, 4, false}}) {
    INFO("E " << E << " k " << k << " renormalize " << renormalize);
    const Vec logits = normal_values(kSeed, 1, N * E, 2.0);
    const auto ref = test::router_reference(logits, N, E, k, renormalize);
    Vec probs(N * E), weights(N * k);
    Ids experts(N * k);
    cpu::moe_router_forward<double>(probs.data(), weights.data(), experts.data(), logits.data(), N,
                                    E, k, renormalize);
    CHECK(experts == ref.experts);
    CHECK(max_abs_diff(probs, ref.probs) < 1e-15);
    CHECK(max_abs_diff(weights, ref.weights) < 1e-15);
  }
}

TEST_CASE("moe router: equal probabilities choose the lower expert first", "[moe][router]") {
  // Row 0: all equal; row 1: experts 1 and 3 tie for the top, 0 and 2 for the next.
  const int N = 2, E = 4, k = 3;
  const Vec logits = {0.5, 0.5, 0.5, 0.5, 1.0, 2.0, 1.0, 2.0};
  Ids experts(N * k);
  std::vector<float> fl(logits.begin(), logits.end()), fp(N * E), fw(N * k);
  cpu::moe_router_forward<float>(fp.data(), fw.data(), experts.data(), fl.data(), N, E, k, true);
  CHECK(experts == Ids{0, 1, 2, 1, 3, 0});
  CHECK(fw[0] == fw[1]);
  CHECK(fw[0] == fw[2]);
}

// L = sum(weights * Rw) + sum_e D[e] * sum_n probs[n,e]: the router's backward with the
// load-balancing term's shape (one dprobs_shared for every row).
TEST_CASE("moe router backward matches finite differences (float64)", "[moe][router][fd]") {
  const int N = 11;
  for (auto [E, k, renormalize] :
       {std::tuple{8, 2, true}, std::tuple{6, 3, false}, std::tuple{5, 1, true},
        std::tuple{4, 4, true}, std::tuple{4, 4, false}}) {
    INFO("E " << E << " k " << k << " renormalize " << renormalize);
    Vec logits = normal_values(kSeed, 2, N * E, 2.0);
    const Vec Rw = normal_values(kSeed, 3, N * k);
    const Vec D = normal_values(kSeed, 4, E);
    Vec probs(N * E), weights(N * k);
    Ids experts(N * k);
    auto f = [&] {
      cpu::moe_router_forward<double>(probs.data(), weights.data(), experts.data(), logits.data(),
                                      N, E, k, renormalize);
      double s = dot(weights, Rw);
      for (int n = 0; n < N; ++n) {
        for (int e = 0; e < E; ++e) s += D[e] * probs[n * E + e];
      }
      return s;
    };
    f();
    Vec dlogits(N * E, 0.5);
    cpu::moe_router_backward<double>(dlogits.data(), Rw.data(), probs.data(), experts.data(),
                                     D.data(), N, E, k, renormalize, GradWrite::kAccumulate);
    for (double& v : dlogits) v -= 0.5;  // it accumulated
    check_gradient("dlogits", logits, dlogits, f);
    f();  // probs of the unperturbed logits again
    // Overwrite, and the weights' term alone (dprobs_shared null), and the shared term alone.
    Vec over(N * E, 9.0), weights_only(N * E, 0.0), shared_only(N * E, 0.0);
    cpu::moe_router_backward<double>(over.data(), Rw.data(), probs.data(), experts.data(), D.data(),
                                     N, E, k, renormalize, GradWrite::kOverwrite);
    cpu::moe_router_backward<double>(weights_only.data(), Rw.data(), probs.data(), experts.data(),
                                     nullptr, N, E, k, renormalize, GradWrite::kAccumulate);
    cpu::moe_router_backward<double>(shared_only.data(), nullptr, probs.data(), experts.data(),
                                     D.data(), N, E, k, renormalize, GradWrite::kAccumulate);
    for (int i = 0; i < N * E; ++i) {
      CHECK(over[i] == Approx(dlogits[i]).margin(1e-12));
      CHECK(weights_only[i] + shared_only[i] == Approx(dlogits[i]).margin(1e-12));
    }
  }
}

// transformers' load_balancing_loss_func for L layers, written out: every (row, slot) counts one
// for its expert, probs summed per expert, both over all L*N rows.
double lb_reference(const std::vector<Vec>& probs, const std::vector<Ids>& experts, int N, int E,
                    int k) {
  const double T = static_cast<double>(probs.size()) * N;
  Vec count(E, 0.0), psum(E, 0.0);
  for (std::size_t l = 0; l < probs.size(); ++l) {
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < k; ++j) count[experts[l][n * k + j]] += 1;
      for (int e = 0; e < E; ++e) psum[e] += probs[l][n * E + e];
    }
  }
  double s = 0;
  for (int e = 0; e < E; ++e) s += count[e] / T * (psum[e] / T);
  return s * E;
}

TEST_CASE("moe load-balancing loss over layers and its gradient (float64)", "[moe][loss][fd]") {
  const int N = 9, E = 6, k = 2, L = 3;
  std::vector<Vec> logits(L), probs(L, Vec(N * E));
  std::vector<Ids> experts(L, Ids(N * k));
  Vec weights(N * k);
  for (int l = 0; l < L; ++l) logits[l] = normal_values(kSeed, 10 + l, N * E, 1.5);
  auto forward = [&] {
    Vec counts(E, 0.0), probsum(E, 0.0);
    for (int l = 0; l < L; ++l) {
      cpu::moe_router_forward<double>(probs[l].data(), weights.data(), experts[l].data(),
                                      logits[l].data(), N, E, k, true);
      cpu::moe_aux_stats_accumulate<double>(counts.data(), probsum.data(), probs[l].data(),
                                            experts[l].data(), N, E, k);
    }
    double loss = 0;
    cpu::moe_load_balancing_loss<double>(&loss, counts.data(), probsum.data(), E, L * N);
    return std::pair{loss, counts};
  };
  const auto [loss, counts] = forward();
  CHECK(loss == Approx(lb_reference(probs, experts, N, E, k)).epsilon(1e-14));
  double total = 0;
  for (double c : counts) total += c;
  CHECK(total == L * N * k);  // every slot counts one
  // The gradient of 0.7 * loss through each layer's router (weights not in the loss).
  Vec dshared(E);
  cpu::moe_load_balancing_loss_backward<double>(dshared.data(), counts.data(), 0.7, E, L * N);
  for (int l = 0; l < L; ++l) {
    INFO("layer " << l);
    Vec dlogits(N * E, 0.0);
    cpu::moe_router_backward<double>(dlogits.data(), nullptr, probs[l].data(), experts[l].data(),
                                     dshared.data(), N, E, k, true, GradWrite::kAccumulate);
    check_gradient("dlogits", logits[l], dlogits, [&] { return 0.7 * forward().first; });
  }
}

TEST_CASE("moe router z-loss and its gradient (float64)", "[moe][loss][fd]") {
  const int N = 10, E = 7;
  Vec logits = normal_values(kSeed, 20, N * E, 3.0, 0.5);
  auto f = [&] {
    double z = 0;
    cpu::moe_router_z_loss_forward<double>(&z, logits.data(), N, E);
    return z;
  };
  double ref = 0;
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(logits[n * E + e]);
    ref += std::log(s) * std::log(s);
  }
  CHECK(f() == Approx(ref / N).epsilon(1e-14));
  Vec dlogits(N * E, 0.0);
  cpu::moe_router_z_loss_backward<double>(dlogits.data(), logits.data(), 1.3, N, E);
  check_gradient("dlogits", logits, dlogits, [&] { return 1.3 * f(); });
}

// Routings: random with some slots routed nowhere; every token to one expert (the rest empty);
// k = 1; k = E (every expert takes every token).
struct Routing {
  const char* name;
  int N, k, E;
  Ids experts;
};
std::vector<Routing> routings() {
  std::vector<Routing> out;
  {
    Routing r{"random with empty experts and unrouted slots", 17, 2, 7, {}};
    const Ids draw = test::token_values(kSeed, 30, r.N * r.k, 5);  // experts 5, 6 stay empty
    for (int q = 0; q < r.N * r.k; ++q) r.experts.push_back(q % 9 == 4 ? -1 : draw[q]);
    out.push_back(r);
  }
  out.push_back({"all tokens to one expert", 12, 2, 4, {}});
  for (int n = 0; n < 12; ++n) out.back().experts.insert(out.back().experts.end(), {2, -1});
  out.push_back({"k = 1", 15, 1, 3, test::token_values(kSeed, 31, 15, 3)});
  out.push_back({"k = E", 6, 3, 3, {}});
  for (int n = 0; n < 6; ++n) {
    out.back().experts.insert(out.back().experts.end(), {(n + 1) % 3, n % 3, (n + 2) % 3});
  }
  return out;
}

TEST_CASE("moe dispatch plan is the stable sort of the pairs by expert", "[moe][dispatch]") {
  for (const Routing& r : routings()) {
    INFO(r.name);
    const auto ref = test::plan_reference(r.experts, r.N, r.k, r.E);
    Ids counts(r.E), offsets(r.E + 1), row_of(r.N * r.k), source(r.N * r.k, -7);
    cpu::moe_dispatch_plan(counts.data(), offsets.data(), row_of.data(), source.data(),
                           r.experts.data(), r.N, r.k, r.E);
    CHECK(counts == ref.counts);
    CHECK(offsets == ref.offsets);
    CHECK(row_of == ref.row_of);
    CHECK(Ids(source.begin(), source.begin() + offsets[r.E]) == ref.source);
    for (int q = offsets[r.E]; q < r.N * r.k; ++q) CHECK(source[q] == -7);  // untouched
  }
  const Ids bad = {0, 3};
  Ids c(3), o(4), ro(2), s(2);
  CHECK_THROWS_AS(
      cpu::moe_dispatch_plan(c.data(), o.data(), ro.data(), s.data(), bad.data(), 1, 2, 3),
      InvalidArgument);
}

// L = sum(combine(gather-independent y, w) * R): gradients of y and w; and gather's backward as
// the adjoint of gather (finite differences of sum(gather(x) * Re)).
TEST_CASE("moe gather and combine and their backwards (float64)", "[moe][dispatch][fd]") {
  const int C = 5;
  for (const Routing& r : routings()) {
    INFO(r.name);
    const int N = r.N, k = r.k, P = N * k;
    const auto plan = test::plan_reference(r.experts, N, k, r.E);
    const int R = plan.offsets[r.E];
    Vec x = normal_values(kSeed, 40, N * C);
    Vec y = normal_values(kSeed, 41, P * C);
    Vec w = normal_values(kSeed, 42, P, 0.5, 0.3);
    const Vec Rout = normal_values(kSeed, 43, N * C);
    const Vec Re = normal_values(kSeed, 44, P * C);
    // Gather against its definition; rows from R on untouched.
    Vec xe(P * C, 11.0);
    cpu::moe_gather<double>(xe.data(), x.data(), plan.row_of.data(), N, k, C);
    for (int row = 0; row < P; ++row) {
      for (int c = 0; c < C; ++c) {
        const double want = row < R ? x[(plan.source[row] / k) * C + c] : 11.0;
        CHECK(xe[row * C + c] == want);
      }
    }
    auto fg = [&] {
      Vec e(P * C, 0.0);
      cpu::moe_gather<double>(e.data(), x.data(), plan.row_of.data(), N, k, C);
      double s = 0;
      for (int i = 0; i < R * C; ++i) s += e[i] * Re[i];
      return s;
    };
    Vec dx(N * C, 0.0);
    Vec dxe(Re.begin(), Re.end());
    for (int i = R * C; i < P * C; ++i) dxe[i] = 1e9;  // rows past R must not be read
    cpu::moe_gather_backward<double>(dx.data(), dxe.data(), plan.row_of.data(), N, k, C);
    if (R > 0) check_gradient("gather dx", x, dx, fg);
    // Combine against its definition, then its backward.
    Vec out(N * C, 5.0);
    cpu::moe_combine<double>(out.data(), y.data(), w.data(), plan.row_of.data(), N, k, C);
    for (int n = 0; n < N; ++n) {
      for (int c = 0; c < C; ++c) {
        double want = 0;
        for (int j = 0; j < k; ++j) {
          const int row = plan.row_of[n * k + j];
          if (row >= 0) want += w[n * k + j] * y[row * C + c];
        }
        CHECK(out[n * C + c] == Approx(want).margin(1e-14));
      }
    }
    auto fc = [&] {
      Vec o(N * C);
      cpu::moe_combine<double>(o.data(), y.data(), w.data(), plan.row_of.data(), N, k, C);
      return dot(o, Rout);
    };
    Vec dy(P * C, 3.0), dw(P, 3.0);
    cpu::moe_combine_backward<double>(dy.data(), dw.data(), Rout.data(), y.data(), w.data(),
                                      plan.row_of.data(), N, k, C);
    for (int i = R * C; i < P * C; ++i) CHECK(dy[i] == 3.0);  // rows past R untouched
    for (int q = 0; q < P; ++q) {
      if (plan.row_of[q] < 0) CHECK(dw[q] == 0.0);
    }
    for (int i = R * C; i < P * C; ++i) dy[i] = 0.0;  // y's rows past R do not reach out
    if (R > 0) {
      check_gradient("combine dy", y, dy, fc);
      check_gradient("combine dw", w, dw, fc);
    }
  }
}

TEST_CASE("grouped linear forward and backward (float64), empty experts skipped", "[moe][fd]") {
  const int E = 5, IC = 7, OC = 6;
  const Ids offsets = {0, 4, 4, 13, 13, 16};  // experts 1 and 3 have no rows
  const int R = offsets[E];
  Vec x = normal_values(kSeed, 50, R * IC);
  Vec w = normal_values(kSeed, 51, E * OC * IC, 0.3);
  const Vec Rout = normal_values(kSeed, 52, R * OC);
  Vec out(R * OC);
  auto f = [&] {
    cpu::grouped_linear_forward<double>(out.data(), x.data(), w.data(), offsets.data(), E, IC, OC,
                                        nullptr);
    return dot(out, Rout);
  };
  f();
  CHECK(max_abs_diff(out, test::grouped_linear_reference(x, w, offsets, E, IC, OC)) < 1e-13);
  Vec dx(R * IC, 0.0), dw(E * OC * IC, 0.25);
  cpu::grouped_linear_backward<double, double>(dx.data(), dw.data(), Rout.data(), x.data(),
                                               w.data(), offsets.data(), E, IC, OC, nullptr);
  for (int i = 0; i < OC * IC; ++i) {
    CHECK(dw[1 * OC * IC + i] == 0.25);  // an expert without rows keeps its gradient
    CHECK(dw[3 * OC * IC + i] == 0.25);
  }
  for (double& v : dw) v -= 0.25;
  check_gradient("dinp", x, dx, f);
  check_gradient("dweight", w, dw, f);
  // Overwrite, and no dinp at all.
  Vec over(R * IC, 8.0), dw2(E * OC * IC, 0.0);
  cpu::grouped_linear_backward<double, double>(over.data(), dw2.data(), Rout.data(), x.data(),
                                               w.data(), offsets.data(), E, IC, OC, nullptr,
                                               GradWrite::kOverwrite);
  CHECK(max_abs_diff(over, dx) < 1e-13);
  cpu::grouped_linear_backward<double, double>(nullptr, dw2.data(), Rout.data(), x.data(), w.data(),
                                               offsets.data(), E, IC, OC, nullptr);
  CHECK(max_abs_diff(dw2, Vec(dw.size(), 0.0)) > 0);
  for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw2[i] == Approx(2 * dw[i]).margin(1e-12));
}

// A slice of each expert's weight (transformers' fused gate_up_proj): weight_stride 2*OC*IC, the
// second half at + OC*IC, equal to the dense weights of those halves; the gradient lands in the
// same slice and nowhere else.
TEST_CASE("grouped linear on strided expert weights (float64)", "[moe]") {
  const int E = 3, IC = 5, OC = 4;
  const Ids offsets = {0, 3, 3, 7};
  const int R = offsets[E];
  const Vec x = normal_values(kSeed, 55, R * IC);
  const Vec fused = normal_values(kSeed, 56, E * 2 * OC * IC);
  const Vec dout = normal_values(kSeed, 57, R * OC);
  Vec upper;  // each expert's second OC rows, dense
  for (int e = 0; e < E; ++e) {
    upper.insert(upper.end(), fused.begin() + (2 * e + 1) * OC * IC,
                 fused.begin() + (2 * e + 2) * OC * IC);
  }
  Vec dense(R * OC), strided(R * OC);
  cpu::grouped_linear_forward<double>(dense.data(), x.data(), upper.data(), offsets.data(), E, IC,
                                      OC, nullptr);
  cpu::grouped_linear_forward<double>(strided.data(), x.data(), fused.data() + OC * IC,
                                      offsets.data(), E, IC, OC, nullptr, 2 * OC * IC);
  CHECK(strided == dense);
  Vec dx_dense(R * IC, 0.0), dw_dense(E * OC * IC, 0.0), dx(R * IC, 0.0);
  Vec dw_fused(E * 2 * OC * IC, 0.0);
  cpu::grouped_linear_backward<double, double>(dx_dense.data(), dw_dense.data(), dout.data(),
                                               x.data(), upper.data(), offsets.data(), E, IC, OC,
                                               nullptr);
  cpu::grouped_linear_backward<double, double>(
      dx.data(), dw_fused.data() + OC * IC, dout.data(), x.data(), fused.data() + OC * IC,
      offsets.data(), E, IC, OC, nullptr, GradWrite::kAccumulate, 2 * OC * IC);
  CHECK(dx == dx_dense);
  for (int e = 0; e < E; ++e) {
    for (int i = 0; i < OC * IC; ++i) {
      CHECK(dw_fused[(2 * e) * OC * IC + i] == 0.0);  // the other slice untouched
      CHECK(dw_fused[(2 * e + 1) * OC * IC + i] == dw_dense[e * OC * IC + i]);
    }
  }
}

// ---- The ops on a CPU context, each storage type, against float64 ----

// Unit roundoff of the storage: every result of the ops is rounded once from fp32.
double roundoff(DType dt) {
  switch (dt) {
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -24);
  }
}

// The inputs of a dtype as that dtype holds them (the reference computes from these).
Vec rounded(const Vec& v, DType dt) {
  return test::decode(test::encode(v, dt), dt);
}

TEST_CASE("moe ops on a CPU context: each storage type against float64", "[moe][dtypes]") {
  const int N = 21, E = 6, k = 2, C = 24, I = 20;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    INFO(dtype_name(dt));
    const double u = roundoff(dt);
    const double f32 = std::ldexp(1.0, -24);
    MoeBackend be(DeviceType::kCpu);
    const Vec logits = rounded(normal_values(kSeed, 60, N * E, 2.0), dt);
    const Vec x = rounded(normal_values(kSeed, 61, N * C), dt);
    const Vec wg = rounded(normal_values(kSeed, 62, E * I * C, 0.2), dt);

    // Router: probs and weights in fp32 from logits that are exact in the storage type.
    const auto ref = test::router_reference(logits, N, E, k, true);
    const Bytes l = be.put("logits", logits, dt);
    const Floats probs = be.put_f32("probs", Vec(N * E));
    const Floats weights = be.put_f32("weights", Vec(N * k));
    const Ints experts = be.put_ids("experts", Ids(N * k));
    moe_router_forward(*be.ctx, dt, probs, weights, experts, l, N, E, k, true);
    CHECK(be.get_ids("experts", N * k) == ref.experts);
    // Softmax in fp32: a few roundings of exp, the sum over E and the division.
    CHECK(test::rel_error(be.get("probs", N * E), ref.probs) < 8 * E * f32);
    CHECK(test::rel_error(be.get("weights", N * k), ref.weights) < 8 * E * f32);

    // Dispatch, gather, grouped linear, combine.
    const Ints counts = be.put_ids("counts", Ids(E));
    const Ints offsets = be.put_ids("offsets", Ids(E + 1));
    const Ints row_of = be.put_ids("row_of", Ids(N * k));
    const Ints source = be.put_ids("source", Ids(N * k));
    moe_dispatch_plan(*be.ctx, counts, offsets, row_of, source, experts, N, k, E);
    const auto plan = test::plan_reference(ref.experts, N, k, E);
    const Ids host_offsets = be.get_ids("offsets", E + 1);
    CHECK(host_offsets == plan.offsets);
    CHECK(be.get_ids("row_of", N * k) == plan.row_of);
    const int R = plan.offsets[E];
    const Bytes xe = be.put("xe", Vec(N * k * C), dt);
    moe_gather(*be.ctx, dt, xe, be.put("x", x, dt), row_of, N, k, C);
    Vec xe_ref(R * C);
    for (int row = 0; row < R; ++row) {
      for (int c = 0; c < C; ++c) xe_ref[row * C + c] = x[(plan.source[row] / k) * C + c];
    }
    Vec xe_got = be.get("xe", N * k * C);
    xe_got.resize(R * C);
    CHECK(xe_got == xe_ref);  // copies: exact
    const Bytes h = be.put("h", Vec(N * k * I), dt);
    grouped_linear_forward(*be.ctx, dt, h, xe, be.put("wg", wg, dt), host_offsets, E, C, I);
    Vec h_got = be.get("h", N * k * I);
    h_got.resize(R * I);
    const Vec h_ref = test::grouped_linear_reference(xe_ref, wg, plan.offsets, E, C, I);
    // One rounding to the storage, plus fp32 GEMM accumulation over C terms.
    CHECK(test::rel_error(h_got, h_ref) < u + 2 * C * f32);

    // Grouped linear backward: dW (fp32 gradients) and dinp, against float64.
    const Vec dh = rounded(normal_values(kSeed, 64, R * I), dt);
    Vec dh_full = dh;
    dh_full.resize(N * k * I, 0.0);
    const Bytes dxe = be.put("dxe", Vec(N * k * C), dt);
    const Bytes dwg = be.put("dwg", Vec(E * I * C), DType::kFloat32);
    grouped_linear_backward(*be.ctx, dt, DType::kFloat32, dxe, dwg, be.put("dh", dh_full, dt), xe,
                            be.put("wg", wg, dt), host_offsets, E, C, I, GradWrite::kOverwrite);
    Vec dwg_ref(E * I * C, 0.0), dxe_ref(R * C, 0.0);
    for (int e = 0; e < E; ++e) {
      for (int row = plan.offsets[e]; row < plan.offsets[e + 1]; ++row) {
        for (int o = 0; o < I; ++o) {
          for (int c = 0; c < C; ++c) {
            dwg_ref[(e * I + o) * C + c] += dh[row * I + o] * xe_ref[row * C + c];
            dxe_ref[row * C + c] += dh[row * I + o] * wg[(e * I + o) * C + c];
          }
        }
      }
    }
    CHECK(test::rel_error(be.get("dwg", E * I * C), dwg_ref) < 2 * N * f32);  // fp32 result
    Vec dxe_got = be.get("dxe", N * k * C);
    dxe_got.resize(R * C);
    CHECK(test::rel_error(dxe_got, dxe_ref) < u + 2 * I * f32);

    // Combine and its backward, on expert outputs y of their own.
    const Vec y = rounded(normal_values(kSeed, 65, N * k * C), dt);
    const Bytes out = be.put("out", Vec(N * C), dt);
    moe_combine(*be.ctx, dt, out, be.put("y", y, dt), weights, row_of, N, k, C);
    Vec out_ref(N * C, 0.0);
    const Vec w_got = be.get("weights", N * k);
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < k; ++j) {
        for (int c = 0; c < C; ++c) {
          out_ref[n * C + c] += w_got[n * k + j] * y[plan.row_of[n * k + j] * C + c];
        }
      }
    }
    CHECK(test::rel_error(be.get("out", N * C), out_ref) < u + 4 * k * f32);
    const Vec g = rounded(normal_values(kSeed, 66, N * C), dt);
    const Bytes dy = be.put("dy", Vec(N * k * C), dt);
    const Floats dw = be.put_f32("dw", Vec(N * k));
    moe_combine_backward(*be.ctx, dt, dy, dw, be.put("g", g, dt), be.put("y", y, dt), weights,
                         row_of, N, k, C);
    Vec dw_ref(N * k, 0.0), dy_ref(N * k * C, 0.0);
    for (int q = 0; q < N * k; ++q) {
      const int row = plan.row_of[q];
      for (int c = 0; c < C; ++c) {
        dw_ref[q] += g[(q / k) * C + c] * y[row * C + c];
        dy_ref[row * C + c] = w_got[q] * g[(q / k) * C + c];
      }
    }
    CHECK(test::rel_error(be.get("dw", N * k), dw_ref) < 2 * C * f32);
    CHECK(test::rel_error(be.get("dy", N * k * C), dy_ref) < u + f32);

    // Gather backward accumulates in slot order, one rounding.
    const Bytes dx = be.put("dx", Vec(N * C, 0.0), dt);
    moe_gather_backward(*be.ctx, dt, dx, dy, row_of, N, k, C);
    const Vec dy_got = be.get("dy", N * k * C);
    Vec dx_ref(N * C, 0.0);
    for (int q = 0; q < N * k; ++q) {
      for (int c = 0; c < C; ++c) dx_ref[(q / k) * C + c] += dy_got[plan.row_of[q] * C + c];
    }
    CHECK(test::rel_error(be.get("dx", N * C), dx_ref) < u + k * f32);

    // The router's backward and the losses through the ops, against the float64 twins.
    const Floats dshared = be.put_f32("dshared", Vec(E));
    const Floats stats_c = be.put_f32("stats_c", Vec(E, 0.0));
    const Floats stats_p = be.put_f32("stats_p", Vec(E, 0.0));
    const Floats loss = be.put_f32("loss", Vec(1));
    moe_aux_stats_accumulate(*be.ctx, stats_c, stats_p, probs, experts, N, E, k);
    moe_load_balancing_loss(*be.ctx, loss, stats_c, stats_p, E, N);
    moe_load_balancing_loss_backward(*be.ctx, dshared, stats_c, 0.5f, E, N);
    CHECK(be.get("loss", 1)[0] ==
          Approx(lb_reference({ref.probs}, {ref.experts}, N, E, k)).epsilon(16 * N * f32));
    const Bytes dl = be.put("dl", Vec(N * E, 0.0), dt);
    moe_router_backward(*be.ctx, dt, dl, dw, probs, experts, dshared, N, E, k, true);
    moe_router_z_loss_backward(*be.ctx, dt, dl, l, 0.25f, N, E);
    Vec dl_ref(N * E, 0.0), dshared_ref(E);
    Vec counts_ref(E, 0.0), psum_ref(E, 0.0);
    cpu::moe_aux_stats_accumulate<double>(counts_ref.data(), psum_ref.data(), ref.probs.data(),
                                          ref.experts.data(), N, E, k);
    cpu::moe_load_balancing_loss_backward<double>(dshared_ref.data(), counts_ref.data(), 0.5, E, N);
    cpu::moe_router_backward<double>(dl_ref.data(), dw_ref.data(), ref.probs.data(),
                                     ref.experts.data(), dshared_ref.data(), N, E, k, true,
                                     GradWrite::kAccumulate);
    cpu::moe_router_z_loss_backward<double>(dl_ref.data(), logits.data(), 0.25, N, E);
    // dw in fp32 from 16-bit operands: its error is below 2C f32 relative; then two roundings.
    CHECK(test::rel_error(be.get("dl", N * E), dl_ref) < 2 * u + 64 * C * f32);
    const Floats z = be.put_f32("z", Vec(1));
    moe_router_z_loss_forward(*be.ctx, dt, z, l, N, E);
    double z_ref = 0;
    cpu::moe_router_z_loss_forward<double>(&z_ref, logits.data(), N, E);
    CHECK(be.get("z", 1)[0] == Approx(z_ref).epsilon(16 * E * f32));
  }
}

TEST_CASE("moe ops check their arguments on the host", "[moe]") {
  MoeBackend be(DeviceType::kCpu);
  const Floats f = be.put_f32("f", Vec(64));
  const Ints ids = be.put_ids("ids", Ids(64));
  const Bytes b = be.put("b", Vec(64), DType::kFloat32);
  CHECK_THROWS_AS(moe_router_forward(*be.ctx, DType::kFloat32, f, f, ids, b, 4, 4, 5, true),
                  InvalidArgument);
  CHECK_THROWS_AS(moe_router_forward(*be.ctx, DType::kFloat32, f, f, ids, b, 4, 4, 0, true),
                  InvalidArgument);
  CHECK_THROWS_AS(grouped_linear_forward(*be.ctx, DType::kFloat32, b, b, b, {0, 2}, 2, 2, 2),
                  InvalidArgument);
  CHECK_THROWS_AS(grouped_linear_forward(*be.ctx, DType::kFloat32, b, b, b, {0, 3, 2}, 2, 2, 2),
                  InvalidArgument);
  CHECK_THROWS_AS(grouped_linear_forward(*be.ctx, DType::kFloat32, b, b, b, {0, 1, 2}, 2, 2, 2, 3),
                  InvalidArgument);  // weight_stride below one expert's 2 x 2
}

// A whole MoE layer (moe_test_support.h's run_moe_layer) with `cpu_threads` OpenMP threads.
using LayerResult = std::vector<Vec>;
LayerResult run_layer(DType dt, int cpu_threads) {
  KernelOptions options;
  options.cpu_threads = cpu_threads;
  MoeBackend be(DeviceType::kCpu, 0, options);
  return test::run_moe_layer(be, dt, 19, 5, 2, 16, 12, kSeed, 70, 0.2);
}

TEST_CASE("moe layer is bit-identical run to run and across thread counts", "[moe][determinism]") {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    INFO(dtype_name(dt));
    const LayerResult a = run_layer(dt, 1);
    const LayerResult b = run_layer(dt, 1);
    const LayerResult c = run_layer(dt, 3);
    CHECK(a == b);
    CHECK(a == c);
  }
}

}  // namespace
}  // namespace zrt::kernels
