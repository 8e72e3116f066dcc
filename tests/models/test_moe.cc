// The mixture-of-experts models against transformers itself (tests/golden/moe_golden.json, made by
// make_moe_golden.py from MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM in
// float64): the parameter table (transformers v5's names, order and shapes), the logits, the
// training loss (cross-entropy + router_aux_loss_coef x the load-balancing term), the term alone
// and every parameter's gradient in fp32; checkpointing and thread count bit-identical; the
// capacity factor's dropped pairs; the z-loss; the presets' published parameter counts; the tiled
// MLP (model.tiling.mlp_rows: the MoE layers and the dense MLPs in tiles of rows) against the
// same goldens and against the untiled model, capacity drops and z-loss included.
//
// The bound. fp32 rounds each operation with a relative error of at most u = 2^-24 ~ 6.0e-8, and
// a dot product of n terms is off by at most gamma_n = n u / (1 - n u) relative to the sum of its
// terms' magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 3.1). Here the
// longest sum has n = 32 (the vocabulary; hidden 16, 2I <= 24, T = 8): gamma_32 ~ 1.9e-6. The
// path from the weights to a logit passes D = 35 rounding stages (per block: RMSNorm, the q/k/v
// projections, the q/k norms, RoPE, the scores, their softmax, the weighted values, o_proj, the
// residual and its RMSNorm, the router's linear and softmax, gate/up, SwiGLU, down, combine, the
// residual: 16; two blocks, then the final norm, the head, the cross-entropy), and a gradient
// twice that, D = 70. With the activations normalised and the weights of std 0.2 each stage
// passes its input's relative error through with a factor of about 1 (no cancellation the
// generator's float64 values show), so to first order the norm-wise relative error is at most
// D gamma_32 = 70 x 1.9e-6 ~ 1.3e-4 for every tensor: kBound below. The routing itself is not
// perturbed: the golden's smallest gap between a token's k-th and (k+1)-th probability
// (min_routing_margin, >= 6e-4) is far above the probabilities' fp32 error (~1e-6), so fp32
// picks the golden's experts, and the loss and every gradient stay within the bound only if it
// does. The observed errors are printed: about 1e-6.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "models/flat_param_access.h"
#include "models/moe/moe_model.h"
#include "models/transformer/tiling.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/models/moe_golden.h"

namespace zrt::moe {
namespace {

constexpr double kBound = 70 * (32 * 0x1p-24) / (1 - 32 * 0x1p-24);

struct Rig {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<kernels::KernelContext> ctx;
  std::unique_ptr<MoeModel> model;
  std::unique_ptr<FlatParamAccess> access;
  Buffer tokens, targets;
  TokenBatch batch;

  Rig(const MoeConfig& config, DType dtype, DType grad_dtype, bool checkpointing = false,
      int threads = 1, int mlp_tile_rows = transformer::kTileAuto) {
    ctx =
        std::make_unique<kernels::KernelContext>(*device, *stream, kernels::KernelOptions{threads});
    MoeOptions options{checkpointing};
    options.mlp_tile_rows = mlp_tile_rows;
    model = std::make_unique<MoeModel>(config, *ctx, options);
    access = std::make_unique<FlatParamAccess>(*device, *stream, model->parameters(),
                                               model->num_modules(), dtype, grad_dtype);
    access->init_from(*model, 1234);
  }
  ~Rig() { stream->synchronize(); }

  void set_golden(const nlohmann::json& g) {
    const auto& params = model->parameters();
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      const int index = test::moe_golden_index(g, params[i].name);
      access->set_param(i, test::moe_golden_weights(params[i].name, index, params[i].numel()));
    }
    const auto in = g["tokens"].get<std::vector<std::int32_t>>();
    const auto tgt = g["targets"].get<std::vector<std::int32_t>>();
    const auto bytes = static_cast<std::int64_t>(in.size() * sizeof(std::int32_t));
    tokens = device->allocate(bytes, MemCategory::kOther, "tokens");
    targets = device->allocate(bytes, MemCategory::kOther, "targets");
    device->copy_to_device(tokens.device<std::byte>(), in.data(), in.size() * 4, *stream);
    device->copy_to_device(targets.device<std::byte>(), tgt.data(), tgt.size() * 4, *stream);
    stream->synchronize();
    batch = TokenBatch{tokens.device<const std::int32_t>(), targets.device<const std::int32_t>(),
                       g["B"], g["T"]};
  }

  float read(DevicePtr<const float> p) {
    float v = 0;
    device->copy_to_host(&v, p.as<const std::byte>(), 4, *stream);
    stream->synchronize();
    return v;
  }
  std::vector<float> logits(int rows, int V) {
    const std::size_t ld = static_cast<std::size_t>(model->logits_row_stride());
    std::vector<float> padded(rows * ld);
    device->copy_to_host(padded.data(), model->logits(), padded.size() * 4, *stream);
    stream->synchronize();
    std::vector<float> dense;
    for (int n = 0; n < rows; ++n) {
      dense.insert(dense.end(), padded.begin() + static_cast<std::ptrdiff_t>(n * ld),
                   padded.begin() + static_cast<std::ptrdiff_t>(n * ld + V));
    }
    return dense;
  }
  std::vector<std::vector<float>> grads() {
    std::vector<std::vector<float>> g;
    for (int i = 0; i < static_cast<int>(model->parameters().size()); ++i) {
      g.push_back(access->read_grad(i));
    }
    return g;
  }
};

// One golden case (make_moe_golden.py's form): the parameter table, the logits, the loss and its
// load-balancing term, every gradient, within kBound of transformers'.
void check_moe_golden_case(const nlohmann::json& g) {
  {
    const std::string label = g["label"];
    INFO(label);
    const MoeConfig config = test::moe_case_config(g);
    Rig rig(config, DType::kFloat32, DType::kFloat32);
    const auto& params = rig.model->parameters();
    REQUIRE(params.size() == g["names"].size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].name == g["names"][i].get<std::string>());
      CHECK(params[i].shape == g["shapes"][i].get<std::vector<std::int64_t>>());
    }
    rig.set_golden(g);
    const int rows = static_cast<int>(g["B"]) * static_cast<int>(g["T"]);
    rig.model->forward(*rig.access, rig.batch);
    const double logits_err =
        test::rel_error(rig.logits(rows, config.vocab_size), test::golden_tensor(g["logits"]));
    INFO("logits: relative error " << logits_err);
    CHECK(logits_err <= kBound);
    // An evaluation reports the cross-entropy alone.
    const double ce = rig.model->read_loss();
    CHECK(std::abs(ce - g["cross_entropy"].get<double>()) <= kBound * std::abs(ce));

    rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
    const double loss = rig.model->read_loss();
    const double lb = rig.read(rig.model->aux_loss());
    INFO("loss " << loss << " (" << g["loss"] << "), load balancing " << lb << " (" << g["aux_loss"]
                 << ")");
    CHECK(std::abs(loss - g["loss"].get<double>()) <= kBound * std::abs(loss));
    CHECK(std::abs(lb - g["aux_loss"].get<double>()) <= kBound * std::abs(lb));
    double worst = std::max(logits_err, 0.0);
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      const auto want = test::golden_tensor(g["grads"][params[i].name]);
      const double err = test::rel_error(rig.access->read_grad(i), want);
      INFO(params[i].name << ": relative error " << err);
      CHECK(err <= kBound);
      worst = std::max(worst, err);
    }
    // Every expert of every MoE layer saw its pairs: N*k of them per layer in all.
    const RoutingStats stats = rig.model->take_routing_stats();
    CHECK(stats.passes == 1);
    CHECK(stats.dropped == 0);
    CHECK(stats.max_tokens >= stats.min_tokens);
    WARN(label << " vs transformers: loss " << loss << " (" << g["loss"] << "), worst relative "
               << "error of the logits or a gradient " << worst << " (bound " << kBound << ")");
  }
}

TEST_CASE("Mixtral, Qwen2-MoE and Qwen3-MoE match transformers (fp32, derived bound)",
          "[moe][golden]") {
  for (const auto& g : test::moe_golden()["cases"]) check_moe_golden_case(g);
}

// Mixtral's sliding_window and Qwen3-MoE's use_sliding_window (every layer, transformers 5) with a
// 3-token window over 8-token sequences: most rows see part of their causal context (the loss
// without the window differs in the second digit), within the same bound.
TEST_CASE("Mixtral and Qwen3-MoE sliding windows match transformers (fp32, derived bound)",
          "[moe][golden][window]") {
  const auto& cases = test::moe_window_golden()["cases"];
  REQUIRE(cases.size() == 2);
  for (const auto& g : cases) {
    REQUIRE(test::moe_case_config(g).sliding_window == 3);
    check_moe_golden_case(g);
  }
}

TEST_CASE("MoE checkpointing and thread count do not change a bit; bf16 is near fp32", "[moe]") {
  for (const auto& g : test::moe_golden()["cases"]) {
    INFO(g["label"].get<std::string>());
    const MoeConfig config = test::moe_case_config(g);
    auto run = [&](bool checkpointing, int threads, DType dtype) {
      Rig r(config, dtype, DType::kFloat32, checkpointing, threads);
      r.set_golden(g);
      r.model->forward_backward(*r.access, r.batch, 1.0f);
      auto grads = r.grads();
      grads.push_back({r.model->read_loss()});
      return grads;
    };
    const auto plain = run(false, 1, DType::kFloat32);
    CHECK(run(true, 1, DType::kFloat32) == plain);
    CHECK(run(false, 4, DType::kFloat32) == plain);
    const auto bf16 = run(false, 1, DType::kBFloat16);
    CHECK(std::abs(bf16.back()[0] - plain.back()[0]) < 0.05);
  }
}

TEST_CASE("A capacity factor drops the pairs past each expert's capacity and counts them",
          "[moe]") {
  const auto& g = test::moe_golden()["cases"][0];
  MoeConfig config = test::moe_case_config(g);
  Rig dropless(config, DType::kFloat32, DType::kFloat32);
  dropless.set_golden(g);
  dropless.model->forward_backward(*dropless.access, dropless.batch, 1.0f);
  const RoutingStats free_stats = dropless.model->take_routing_stats();
  // A capacity of exactly the fullest expert's load drops nothing; half of it drops pairs.
  const int rows = static_cast<int>(g["B"]) * static_cast<int>(g["T"]);
  const double pairs_per_expert =
      static_cast<double>(rows) * config.num_experts_per_tok / config.num_experts;
  config.capacity_factor = static_cast<double>(free_stats.max_tokens) / pairs_per_expert;
  Rig full(config, DType::kFloat32, DType::kFloat32);
  full.set_golden(g);
  full.model->forward_backward(*full.access, full.batch, 1.0f);
  CHECK(full.model->take_routing_stats().dropped == 0);
  CHECK(full.model->read_loss() == dropless.model->read_loss());
  config.capacity_factor = 0.5;
  Rig half(config, DType::kFloat32, DType::kFloat32);
  half.set_golden(g);
  half.model->forward_backward(*half.access, half.batch, 1.0f);
  const RoutingStats stats = half.model->take_routing_stats();
  CHECK(stats.dropped > 0);
  CHECK(stats.max_tokens <= 2 * static_cast<std::int64_t>(std::ceil(0.5 * pairs_per_expert)));
  CHECK(std::isfinite(half.model->read_loss()));
  CHECK(half.model->read_loss() != dropless.model->read_loss());
}

TEST_CASE("The router z-loss adds coef x its value and its gradient reaches the routers", "[moe]") {
  const auto& g = test::moe_golden()["cases"][2];
  MoeConfig config = test::moe_case_config(g);
  Rig base(config, DType::kFloat32, DType::kFloat32);
  base.set_golden(g);
  base.model->forward_backward(*base.access, base.batch, 1.0f);
  config.router_z_loss_coef = 0.5;
  Rig z(config, DType::kFloat32, DType::kFloat32);
  z.set_golden(g);
  z.model->forward_backward(*z.access, z.batch, 1.0f);
  // The z-loss is the mean over the MoE layers' rows of logsumexp(router logits)^2 > 0.
  CHECK(z.model->read_loss() > base.model->read_loss());
  const int router = z.model->block_param(0, MoeModel::kRouter);
  CHECK(z.access->read_grad(router) != base.access->read_grad(router));
  // The last block's experts see only the head's gradient: the z-loss does not reach them.
  const int expert = z.model->block_param(1, MoeModel::kGateUp);
  CHECK(z.access->read_grad(expert) == base.access->read_grad(expert));
}

// Tiles of 3 rows over the goldens' 16 (a short last tile): every MoE layer routes, dispatches,
// runs its experts and combines a tile at a time, and the backward runs each tile's forward again.
// Per row it is the same arithmetic on fewer rows, and the sums over rows (the weights'
// gradients, the router statistics) are split into per-tile partial sums: another order of the
// same fp32 sums, within the same derived bound against float64 transformers.
TEST_CASE("Tiled MoE layers and dense MLPs match transformers (fp32, derived bound)",
          "[moe][golden][tiled]") {
  for (const auto& g : test::moe_golden()["cases"]) {
    const std::string label = g["label"];
    INFO(label);
    const MoeConfig config = test::moe_case_config(g);
    for (const bool checkpointing : {false, true}) {
      INFO("checkpointing " << checkpointing);
      Rig rig(config, DType::kFloat32, DType::kFloat32, checkpointing, 1, 3);
      rig.set_golden(g);
      rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
      CHECK(rig.model->mlp_tiles().moe_rows == 3);
      CHECK(rig.model->mlp_tiles().dense_rows == 3);
      const double loss = rig.model->read_loss();
      const double lb = rig.read(rig.model->aux_loss());
      CHECK(std::abs(loss - g["loss"].get<double>()) <= kBound * std::abs(loss));
      CHECK(std::abs(lb - g["aux_loss"].get<double>()) <= kBound * std::abs(lb));
      const auto& params = rig.model->parameters();
      double worst = 0;
      for (int i = 0; i < static_cast<int>(params.size()); ++i) {
        const double err = test::rel_error(rig.access->read_grad(i),
                                           test::golden_tensor(g["grads"][params[i].name]));
        INFO(params[i].name << ": relative error " << err);
        CHECK(err <= kBound);
        worst = std::max(worst, err);
      }
      // Every MoE layer's N*k pairs counted once a forward, whatever the tiles.
      const std::optional<ExpertLoad> load = rig.model->take_expert_load();
      REQUIRE(load.has_value());
      const std::size_t E = static_cast<std::size_t>(config.num_experts);
      REQUIRE(load->tokens.size() == E * static_cast<std::size_t>(config.num_moe_layers()));
      const std::int64_t pairs = static_cast<std::int64_t>(g["B"]) *
                                 static_cast<std::int64_t>(g["T"]) * config.num_experts_per_tok;
      for (std::size_t l = 0; l * E < load->tokens.size(); ++l) {
        std::int64_t sum = 0;
        for (std::size_t e = 0; e < E; ++e) sum += load->tokens[l * E + e];
        CHECK(sum == pairs);
      }
      // An evaluation forward through the tiles: the cross-entropy alone.
      rig.model->forward(*rig.access, rig.batch);
      const double ce = rig.model->read_loss();
      CHECK(std::abs(ce - g["cross_entropy"].get<double>()) <= kBound * std::abs(ce));
      WARN(label << " tiled (checkpointing " << checkpointing << ") vs transformers: worst "
                 << "relative error of a gradient " << worst << " (bound " << kBound << ")");
    }
  }
}

// Against the untiled model with a capacity factor that drops pairs and a z-loss: the capacity
// is the forward's, applied in token order across the tiles (each expert's pairs taken in the
// earlier tiles counted), so the same pairs drop; the z-loss is the mean over the forward's rows,
// each tile weighted by its share. (A capacity per tile, ceil(0.5 x 6 pairs / E) = 1, would drop
// far more; the z-loss without the share would count it 16/3 times.)
TEST_CASE("Tiled MoE layers drop the same pairs under a capacity factor and take the same z-loss",
          "[moe][tiled]") {
  for (const auto& g : test::moe_golden()["cases"]) {
    const std::string label = g["label"];
    INFO(label);
    MoeConfig config = test::moe_case_config(g);
    config.capacity_factor = 0.5;
    config.router_z_loss_coef = 0.5;
    Rig whole(config, DType::kFloat32, DType::kFloat32, false, 1, transformer::kTileOff);
    Rig tiled(config, DType::kFloat32, DType::kFloat32, false, 1, 3);
    whole.set_golden(g);
    tiled.set_golden(g);
    whole.model->forward_backward(*whole.access, whole.batch, 1.0f);
    tiled.model->forward_backward(*tiled.access, tiled.batch, 1.0f);
    CHECK(whole.model->mlp_tiles().moe_rows == 16);
    CHECK(tiled.model->mlp_tiles().moe_rows == 3);
    const ExpertLoad a = *whole.model->take_expert_load(), b = *tiled.model->take_expert_load();
    CHECK(a.dropped > 0);
    CHECK(b.dropped == a.dropped);
    CHECK(b.tokens == a.tokens);
    const double loss = whole.model->read_loss();
    CHECK(std::abs(tiled.model->read_loss() - loss) <= kBound * std::abs(loss));
    for (int i = 0; i < static_cast<int>(whole.model->parameters().size()); ++i) {
      const double err = test::rel_error(tiled.access->read_grad(i), whole.access->read_grad(i));
      INFO(whole.model->parameters()[i].name << ": relative difference " << err);
      CHECK(err <= kBound);
    }
  }
}

}  // namespace
}  // namespace zrt::moe
