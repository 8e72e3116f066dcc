// GPU parity of the mixture-of-experts kernels (kernels/moe_ops.h): each op on a CUDA
// KernelContext against the same op on a CPU one (its CPU twin), on the same inputs, with fp32
// storage (per-tensor relative error <= 1e-5) and bf16 (<= 1e-2, gradients fp32 or bf16); expert
// indices and the dispatch plan exactly; the routings the CPU tests cover (slots routed nowhere,
// empty experts, all tokens to one expert, k = 1, k = E) at sizes that take several blocks and
// several chunks of the per-expert scan; Qwen2-MoE's shared-expert gate and the loss terms added
// on the device; and a whole layer twice on the GPU, bit for bit.
// Skipped (exit 77) without a GPU; under the CUDA stand-ins (ctest -L standin) the CUDA host
// paths run on the CPU.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/moe_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/moe_test_support.h"
#include "tests/support/gpu_test_support.h"

namespace zrt::kernels {
namespace {

using test::Ids;
using test::MoeBackend;
using test::normal_values;
using test::Vec;

constexpr std::uint64_t kSeed = 9113;

// Runs `op` on the CPU and on the GPU with the same inputs and compares what it names: floating
// buffers by relative error, int32 buffers exactly.
struct Outputs {
  std::map<std::string, std::size_t> floats, ints;
};
using Op = std::function<Outputs(MoeBackend&, DType dt, DType gt)>;
void parity(const std::string& what, const Op& op) {
  for (auto [dt, gt, tol] : {std::tuple{DType::kFloat32, DType::kFloat32, 1e-5},
                             std::tuple{DType::kBFloat16, DType::kFloat32, 1e-2},
                             std::tuple{DType::kBFloat16, DType::kBFloat16, 1e-2}}) {
    MoeBackend cpu(DeviceType::kCpu);
    MoeBackend gpu(DeviceType::kCuda, test::gpu_index());
    const Outputs outputs = op(cpu, dt, gt);
    op(gpu, dt, gt);
    for (const auto& [name, n] : outputs.floats) {
      const double err = test::rel_error(gpu.get(name, n), cpu.get(name, n));
      INFO(what << " " << dtype_name(dt) << "/" << dtype_name(gt) << " " << name
                << ": GPU vs CPU twin relative error " << err);
      CHECK(err <= tol);
    }
    for (const auto& [name, n] : outputs.ints) {
      INFO(what << " " << dtype_name(dt) << " " << name);
      CHECK(gpu.get_ids(name, n) == cpu.get_ids(name, n));
    }
  }
}

TEST_CASE("moe router, its losses: CUDA twin matches the CPU twin", "[cuda][moe]") {
  const int N = 300;
  for (auto [E, k, renormalize] : {std::tuple{8, 2, true}, std::tuple{60, 4, false},
                                   std::tuple{5, 1, true}, std::tuple{4, 4, true}}) {
    INFO("E " << E << " k " << k);
    parity("router", [=](MoeBackend& be, DType dt, DType) {
      const Bytes logits = be.put("logits", normal_values(kSeed, 1, N * E, 2.0), dt);
      const Floats probs = be.put_f32("probs", Vec(N * E));
      const Floats weights = be.put_f32("weights", Vec(N * k));
      const Ints experts = be.put_ids("experts", Ids(N * k));
      const Floats dw = be.put_f32("dw", normal_values(kSeed, 2, N * k));
      const Floats counts = be.put_f32("counts", Vec(E, 1.0));  // accumulates
      const Floats probsum = be.put_f32("probsum", Vec(E, 2.0));
      const Floats lb = be.put_f32("lb", Vec(1));
      const Floats z = be.put_f32("z", Vec(1));
      const Floats dshared = be.put_f32("dshared", Vec(E));
      const Bytes dlogits = be.put("dlogits", normal_values(kSeed, 3, N * E, 0.1), dt);
      moe_router_forward(*be.ctx, dt, probs, weights, experts, logits, N, E, k, renormalize);
      moe_aux_stats_accumulate(*be.ctx, counts, probsum, probs, experts, N, E, k);
      moe_load_balancing_loss(*be.ctx, lb, counts, probsum, E, N + 1);
      moe_load_balancing_loss_backward(*be.ctx, dshared, counts, 0.3f, E, N + 1);
      moe_router_z_loss_forward(*be.ctx, dt, z, logits, N, E);
      moe_router_backward(*be.ctx, dt, dlogits, dw, probs, experts, dshared, N, E, k, renormalize);
      moe_router_z_loss_backward(*be.ctx, dt, dlogits, logits, 0.2f, N, E);
      return Outputs{{{"probs", N * E},
                      {"weights", N * k},
                      {"counts", E},
                      {"probsum", E},
                      {"lb", 1},
                      {"z", 1},
                      {"dshared", E},
                      {"dlogits", N * E}},
                     {{"experts", N * k}}};
    });
  }
}

struct Routing {
  const char* name;
  int N, k, E;
  Ids experts;
};
std::vector<Routing> routings() {
  std::vector<Routing> out;
  {
    // 1400 pairs: two chunks of the per-expert scan, several blocks of the rows kernel.
    Routing r{"random with empty experts and unrouted slots", 700, 2, 9, {}};
    const Ids draw = test::token_values(kSeed, 10, r.N * r.k, 7);  // experts 7, 8 stay empty
    for (int q = 0; q < r.N * r.k; ++q) r.experts.push_back(q % 13 == 5 ? -1 : draw[q]);
    out.push_back(r);
  }
  out.push_back({"all tokens to one expert", 600, 2, 4, {}});
  for (int n = 0; n < 600; ++n) out.back().experts.insert(out.back().experts.end(), {3, 3});
  out.push_back({"k = 1", 1500, 1, 3, test::token_values(kSeed, 11, 1500, 3)});
  out.push_back({"k = E", 400, 3, 3, {}});
  for (int n = 0; n < 400; ++n) {
    out.back().experts.insert(out.back().experts.end(), {(n + 2) % 3, n % 3, (n + 1) % 3});
  }
  return out;
}

TEST_CASE("moe dispatch, gather, combine: CUDA twin matches the CPU twin", "[cuda][moe]") {
  const int C = 40;
  for (const Routing& r : routings()) {
    INFO(r.name);
    parity("dispatch", [&r, C](MoeBackend& be, DType dt, DType) {
      const int N = r.N, k = r.k, E = r.E, P = N * k;
      const Ints experts = be.put_ids("experts", r.experts);
      const Ints counts = be.put_ids("counts", Ids(E, 5));
      const Ints offsets = be.put_ids("offsets", Ids(E + 1, 5));
      const Ints row_of = be.put_ids("row_of", Ids(P, 5));
      const Ints source = be.put_ids("source", Ids(P, 5));
      moe_dispatch_plan(*be.ctx, counts, offsets, row_of, source, experts, N, k, E);
      const Bytes x = be.put("x", normal_values(kSeed, 20, N * C), dt);
      const Bytes xe = be.put("xe", Vec(P * C, 0.0), dt);
      const Bytes y = be.put("y", normal_values(kSeed, 21, P * C), dt);
      const Floats w = be.put_f32("w", normal_values(kSeed, 22, P, 0.5, 0.3));
      const Bytes out = be.put("out", Vec(N * C), dt);
      const Bytes dout = be.put("dout", normal_values(kSeed, 23, N * C), dt);
      const Bytes dy = be.put("dy", Vec(P * C, 0.0), dt);
      const Floats dw = be.put_f32("dw", Vec(P));
      const Bytes dx = be.put("dx", normal_values(kSeed, 24, N * C, 0.1), dt);  // accumulates
      moe_gather(*be.ctx, dt, xe, x, row_of, N, k, C);
      moe_combine(*be.ctx, dt, out, y, w, row_of, N, k, C);
      moe_combine_backward(*be.ctx, dt, dy, dw, dout, y, w, row_of, N, k, C);
      moe_gather_backward(*be.ctx, dt, dx, dy, row_of, N, k, C);
      // source is compared over the rows dispatched only (the rest is untouched 5s on both).
      return Outputs{{{"xe", P * C}, {"out", N * C}, {"dy", P * C}, {"dw", P}, {"dx", N * C}},
                     {{"counts", E}, {"offsets", E + 1}, {"row_of", P}, {"source", P}}};
    });
  }
}

TEST_CASE("grouped linear: CUDA twin matches the CPU twin, empty experts skipped", "[cuda][moe]") {
  const int E = 6, IC = 72, OC = 56;
  const std::vector<std::int32_t> offsets = {0, 40, 40, 143, 150, 150, 230};
  const int R = offsets[E];
  parity("grouped_linear", [&](MoeBackend& be, DType dt, DType gt) {
    const Bytes x = be.put("x", normal_values(kSeed, 30, R * IC), dt);
    const Bytes w = be.put("w", normal_values(kSeed, 31, E * OC * IC, 0.1), dt);
    const Bytes out = be.put("out", Vec(R * OC), dt);
    const Bytes dout = be.put("dout", normal_values(kSeed, 32, R * OC), dt);
    const Bytes dx = be.put("dx", normal_values(kSeed, 33, R * IC, 0.1), dt);  // accumulates
    const Bytes dx_over = be.put("dx_over", Vec(R * IC, 7.0), dt);
    const Bytes dw = be.put("dw", normal_values(kSeed, 34, E * OC * IC, 0.1), gt);
    grouped_linear_forward(*be.ctx, dt, out, x, w, offsets, E, IC, OC);
    grouped_linear_backward(*be.ctx, dt, gt, dx, dw, dout, x, w, offsets, E, IC, OC);
    grouped_linear_backward(*be.ctx, dt, gt, dx_over, dw, dout, x, w, offsets, E, IC, OC,
                            GradWrite::kOverwrite);
    return Outputs{{{"out", R * OC}, {"dx", R * IC}, {"dx_over", R * IC}, {"dw", E * OC * IC}}, {}};
  });
  // The up half of a fused gate_up weight (E, 2*OC, IC): weight_stride 2*OC*IC, offset OC*IC.
  parity("grouped_linear strided", [&](MoeBackend& be, DType dt, DType gt) {
    const std::int64_t stride = std::int64_t{2} * OC * IC;
    const std::ptrdiff_t half = std::ptrdiff_t{OC} * IC;
    const Bytes x = be.put("x", normal_values(kSeed, 35, R * IC), dt);
    const Bytes w = be.put("w", normal_values(kSeed, 36, E * 2 * OC * IC, 0.1), dt);
    const Bytes out = be.put("out", Vec(R * OC), dt);
    const Bytes dout = be.put("dout", normal_values(kSeed, 37, R * OC), dt);
    const Bytes dx = be.put("dx", Vec(R * IC, 0.0), dt);
    const Bytes dw = be.put("dw", normal_values(kSeed, 38, E * 2 * OC * IC, 0.1), gt);
    const std::ptrdiff_t w_half = half * static_cast<std::ptrdiff_t>(dtype_size(dt));
    const std::ptrdiff_t g_half = half * static_cast<std::ptrdiff_t>(dtype_size(gt));
    grouped_linear_forward(*be.ctx, dt, out, x, w + w_half, offsets, E, IC, OC, stride);
    grouped_linear_backward(*be.ctx, dt, gt, dx, dw + g_half, dout, x, w + w_half, offsets, E, IC,
                            OC, GradWrite::kAccumulate, stride);
    return Outputs{{{"out", R * OC}, {"dx", R * IC}, {"dw", E * 2 * OC * IC}}, {}};
  });
  // Frozen experts (model.frozen): a null dweight skips the weight GEMMs; dinp as before.
  parity("grouped_linear frozen", [&](MoeBackend& be, DType dt, DType gt) {
    const Bytes x = be.put("x", normal_values(kSeed, 30, R * IC), dt);
    const Bytes w = be.put("w", normal_values(kSeed, 31, E * OC * IC, 0.1), dt);
    const Bytes dout = be.put("dout", normal_values(kSeed, 32, R * OC), dt);
    const Bytes dx = be.put("dx", normal_values(kSeed, 33, R * IC, 0.1), dt);  // accumulates
    const Bytes dx_over = be.put("dx_over", Vec(R * IC, 7.0), dt);
    grouped_linear_backward(*be.ctx, dt, gt, dx, Bytes(), dout, x, w, offsets, E, IC, OC);
    grouped_linear_backward(*be.ctx, dt, gt, dx_over, Bytes(), dout, x, w, offsets, E, IC, OC,
                            GradWrite::kOverwrite);
    return Outputs{{{"dx", R * IC}, {"dx_over", R * IC}}, {}};
  });
}

TEST_CASE("shared expert gate and loss terms: CUDA twin matches the CPU twin", "[cuda][moe]") {
  // N spans several blocks of the forward's element loop and of the backward's row loop; the gate
  // logits reach +-6 so that sigmoid and its derivative are exercised away from 0.5.
  for (auto [N, C] : {std::tuple{700, 40}, std::tuple{1, 3}, std::tuple{300, 257}}) {
    INFO("N " << N << " C " << C);
    parity("shared gate", [N = N, C = C](MoeBackend& be, DType dt, DType) {
      const Bytes s = be.put("s", normal_values(kSeed, 50, N * C), dt);
      const Bytes g = be.put("g", normal_values(kSeed, 51, N, 3.0), dt);
      const Bytes out = be.put("out", normal_values(kSeed, 52, N * C), dt);  // accumulates
      const Bytes dout = be.put("dout", normal_values(kSeed, 53, N * C), dt);
      const Bytes ds = be.put("ds", Vec(N * C, 7.0), dt);  // overwritten
      const Bytes dg = be.put("dg", Vec(N, 7.0), dt);      // overwritten
      moe_shared_gate_forward(*be.ctx, dt, out, s, g, N, C);
      moe_shared_gate_backward(*be.ctx, dt, ds, dg, dout, s, g, N, C);
      return Outputs{{{"out", N * C}, {"ds", N * C}, {"dg", N}}, {}};
    });
  }
  parity("add loss term", [](MoeBackend& be, DType, DType) {
    const Floats loss = be.put_f32("loss", Vec(1, 2.5));
    const Floats lb = be.put_f32("lb", Vec(1, 0.75));
    const Floats z = be.put_f32("z", Vec(1, -1.25));
    moe_add_loss_term(*be.ctx, loss, lb, 0.02f);
    moe_add_loss_term(*be.ctx, loss, z, 0.001f);
    return Outputs{{{"loss", 1}}, {}};
  });
}

// A whole layer on the GPU twice: the same bits (no atomics anywhere).
std::vector<Vec> gpu_layer(DType dt) {
  MoeBackend be(DeviceType::kCuda, test::gpu_index());
  return test::run_moe_layer(be, dt, 333, 8, 2, 64, 48, kSeed, 40, 0.1);
}

TEST_CASE("moe layer on the GPU is bit-identical run to run", "[cuda][moe][determinism]") {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    INFO(dtype_name(dt));
    CHECK(gpu_layer(dt) == gpu_layer(dt));
  }
}

}  // namespace
}  // namespace zrt::kernels
