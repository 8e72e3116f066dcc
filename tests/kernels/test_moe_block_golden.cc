// transformers' sparse MoE blocks (tests/golden/moe_block_golden.json, made by
// tests/golden/make_moe_block_golden.py: MixtralSparseMoeBlock, top-2 of 8 renormalised, and
// Qwen3MoeSparseMoeBlock, top-2 of 6 not renormalised, in float64) composed of zrt's kernels in
// fp32 on a CPU context, as the models will compose them: the gate's linear_forward, the router,
// the dispatch plan, gather, the experts' gate and up projections as grouped linears on
// transformers' fused gate_up_proj, swiglu, the down projection, combine; the load-balancing loss
// over two layers (the block's router and a stored second set of logits) and the router z-loss;
// then the backward of sum(out * R) + aux * lb + z * z_loss in reverse. Every value is checked
// against the golden at a tolerance from fp32 arithmetic (below).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/moe_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/moe_test_support.h"

namespace zrt::kernels {
namespace {

using test::Ids;
using test::MoeBackend;
using test::Vec;

const nlohmann::json& moe_golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_MOE_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_MOE_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}

// A base64 little-endian float64 tensor of the golden.
Vec f64(const nlohmann::json& j) {
  const auto bytes = test::base64_decode(j.at("f64").get<std::string>());
  Vec out(bytes.size() / 8);
  std::memcpy(out.data(), bytes.data(), out.size() * 8);
  return out;
}

// fp32 against float64: the golden's own router runs in fp32, and every kernel rounds each
// result once to fp32 after sums of at most 2I = 24 terms, through a chain of at most eight ops
// (gather, two GEMMs, swiglu, combine and their backwards). Rounding errors of random sign grow as
// the square root of their count: 8 ops x sqrt(24) x 2^-24 ~ 2.3e-6 relative (norm-wise), doubled
// for the exp and log of the softmaxes. (Measured: below 4e-7.)
constexpr double kTol = 5e-6;

void check_close(const std::string& what, const Vec& got, const Vec& want) {
  const double err = test::rel_error(got, want);
  INFO(what << ": relative error " << err << " against transformers (float64)");
  CHECK(err < kTol);
}

TEST_CASE("MoE blocks of the kernels match transformers' Mixtral and Qwen3-MoE", "[moe][golden]") {
  const auto& doc = moe_golden();
  const int N = doc.at("N"), C = doc.at("C"), I = doc.at("I");
  const float aux = doc.at("aux_coef"), zc = doc.at("z_coef");
  const DType dt = DType::kFloat32;
  for (const auto& g : doc.at("cases")) {
    const std::string name = g.at("name");
    const int E = g.at("E"), k = g.at("k");
    const bool renormalize = g.at("renormalize");
    INFO(name);
    MoeBackend be(DeviceType::kCpu);
    const Vec gate_up = f64(g.at("gate_up_proj"));
    const Bytes x = be.put("x", f64(g.at("x")), dt);
    const Bytes wr = be.put("wr", f64(g.at("router_weight")), dt);
    // transformers v5's fused gate_up_proj (E,2I,C) as it is: the gate projection is each
    // expert's first I rows, the up projection the next I (weight_stride 2I*C).
    const Bytes wgu = be.put("wgu", gate_up, dt);
    const Bytes wg = wgu;
    const Bytes wu = wgu + std::ptrdiff_t{I} * C * 4;
    const std::int64_t stride = std::int64_t{2} * I * C;
    const Bytes wd = be.put("wd", f64(g.at("down_proj")), dt);
    const Bytes logits2 = be.put("logits2", f64(g.at("logits2")), dt);
    const int P = N * k;

    // ---- forward ----
    const Bytes logits = be.put("logits", Vec(N * E), dt);
    linear_forward(*be.ctx, dt, logits, x, wr, {}, N, C, E);
    const Floats probs = be.put_f32("probs", Vec(N * E));
    const Floats weights = be.put_f32("weights", Vec(P));
    const Ints experts = be.put_ids("experts", Ids(P));
    moe_router_forward(*be.ctx, dt, probs, weights, experts, logits, N, E, k, renormalize);
    const Ints counts = be.put_ids("counts", Ids(E));
    const Ints offsets = be.put_ids("offsets", Ids(E + 1));
    const Ints row_of = be.put_ids("row_of", Ids(P));
    const Ints source = be.put_ids("source", Ids(P));
    moe_dispatch_plan(*be.ctx, counts, offsets, row_of, source, experts, N, k, E);
    const Ids host_offsets = be.get_ids("offsets", E + 1);  // the layer's one host wait
    const Bytes xe = be.put("xe", Vec(P * C), dt);
    const Bytes hg = be.put("hg", Vec(P * I), dt);
    const Bytes hu = be.put("hu", Vec(P * I), dt);
    const Bytes h = be.put("h", Vec(P * I), dt);
    const Bytes y = be.put("y", Vec(P * C), dt);
    const Bytes out = be.put("out", Vec(N * C), dt);
    moe_gather(*be.ctx, dt, xe, x, row_of, N, k, C);
    grouped_linear_forward(*be.ctx, dt, hg, xe, wg, host_offsets, E, C, I, stride);
    grouped_linear_forward(*be.ctx, dt, hu, xe, wu, host_offsets, E, C, I, stride);
    swiglu_forward(*be.ctx, dt, h, hg, hu, std::int64_t{P} * I);
    grouped_linear_forward(*be.ctx, dt, y, h, wd, host_offsets, E, I, C);
    moe_combine(*be.ctx, dt, out, y, weights, row_of, N, k, C);

    check_close("router logits", be.get("logits", N * E), f64(g.at("logits")));
    Ids want_experts;
    for (const auto& row : g.at("experts")) {
      for (const auto& e : row) want_experts.push_back(e.get<std::int32_t>());
    }
    CHECK(be.get_ids("experts", P) == want_experts);
    check_close("routing weights", be.get("weights", P), f64(g.at("weights")));
    check_close("block output", be.get("out", N * C), f64(g.at("out")));

    // Load-balancing loss over the two layers, and the block's z-loss.
    const Floats probs2 = be.put_f32("probs2", Vec(N * E));
    const Floats weights2 = be.put_f32("weights2", Vec(P));
    const Ints experts2 = be.put_ids("experts2", Ids(P));
    moe_router_forward(*be.ctx, dt, probs2, weights2, experts2, logits2, N, E, k, renormalize);
    const Floats stat_counts = be.put_f32("stat_counts", Vec(E, 0.0));
    const Floats stat_probs = be.put_f32("stat_probs", Vec(E, 0.0));
    moe_aux_stats_accumulate(*be.ctx, stat_counts, stat_probs, probs, experts, N, E, k);
    moe_aux_stats_accumulate(*be.ctx, stat_counts, stat_probs, probs2, experts2, N, E, k);
    const Floats lb = be.put_f32("lb", Vec(1));
    moe_load_balancing_loss(*be.ctx, lb, stat_counts, stat_probs, E, 2 * N);
    const Floats z = be.put_f32("z", Vec(1));
    moe_router_z_loss_forward(*be.ctx, dt, z, logits, N, E);
    CHECK(be.get("lb", 1)[0] == Approx(g.at("lb_loss").get<double>()).epsilon(kTol));
    CHECK(be.get("z", 1)[0] == Approx(g.at("z_loss").get<double>()).epsilon(kTol));

    // ---- backward of sum(out * R) + aux * lb + z * z_loss ----
    const Bytes dout = be.put("dout", f64(g.at("R")), dt);
    const Bytes dy = be.put("dy", Vec(P * C), dt);
    const Floats dw = be.put_f32("dw", Vec(P));
    const Bytes dh = be.put("dh", Vec(P * I), dt);
    const Bytes dhg = be.put("dhg", Vec(P * I, 0.0), dt);
    const Bytes dhu = be.put("dhu", Vec(P * I, 0.0), dt);
    const Bytes dxe = be.put("dxe", Vec(P * C), dt);
    const Bytes dx = be.put("dx", Vec(N * C, 0.0), dt);
    const Bytes dwgu = be.put("dwgu", Vec(E * 2 * I * C, 0.0), dt);
    const Bytes dwd = be.put("dwd", Vec(E * C * I, 0.0), dt);
    const Bytes dwr = be.put("dwr", Vec(E * C, 0.0), dt);
    const Bytes dlogits = be.put("dlogits", Vec(N * E), dt);
    const Bytes dlogits2 = be.put("dlogits2", Vec(N * E), dt);
    const Floats dshared = be.put_f32("dshared", Vec(E));
    moe_combine_backward(*be.ctx, dt, dy, dw, dout, y, weights, row_of, N, k, C);
    grouped_linear_backward(*be.ctx, dt, dt, dh, dwd, dy, h, wd, host_offsets, E, I, C,
                            GradWrite::kOverwrite);
    swiglu_backward(*be.ctx, dt, dhg, dhu, dh, hg, hu, std::int64_t{P} * I);
    grouped_linear_backward(*be.ctx, dt, dt, dxe, dwgu, dhg, xe, wg, host_offsets, E, C, I,
                            GradWrite::kOverwrite, stride);
    grouped_linear_backward(*be.ctx, dt, dt, dxe, dwgu + std::ptrdiff_t{I} * C * 4, dhu, xe, wu,
                            host_offsets, E, C, I, GradWrite::kAccumulate, stride);
    moe_gather_backward(*be.ctx, dt, dx, dxe, row_of, N, k, C);
    moe_load_balancing_loss_backward(*be.ctx, dshared, stat_counts, aux, E, 2 * N);
    moe_router_backward(*be.ctx, dt, dlogits, dw, probs, experts, dshared, N, E, k, renormalize,
                        GradWrite::kOverwrite);
    moe_router_z_loss_backward(*be.ctx, dt, dlogits, logits, zc, N, E);
    moe_router_backward(*be.ctx, dt, dlogits2, {}, probs2, experts2, dshared, N, E, k, renormalize,
                        GradWrite::kOverwrite);
    linear_backward(*be.ctx, dt, dt, dx, dwr, {}, dlogits, x, wr, N, C, E);

    check_close("dx", be.get("dx", N * C), f64(g.at("dx")));
    check_close("drouter_weight", be.get("dwr", E * C), f64(g.at("drouter_weight")));
    check_close("dgate_up_proj", be.get("dwgu", E * 2 * I * C), f64(g.at("dgate_up_proj")));
    check_close("ddown_proj", be.get("dwd", E * C * I), f64(g.at("ddown_proj")));
    check_close("dlogits2 (load-balancing loss only)", be.get("dlogits2", N * E),
                f64(g.at("dlogits2")));
  }
}

}  // namespace
}  // namespace zrt::kernels
