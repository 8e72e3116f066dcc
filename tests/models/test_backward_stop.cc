// A backward that ends at the lowest module with a trained parameter (model_interface.h's
// ParamAccess::first_backward_module, Model::stops_backward_early): with the embedding and the
// lower blocks frozen, the shared transformer driver runs no backward, recompute or host copy
// below that module, and everything it does compute is what the whole backward computes: the same
// losses and the same bits in every trained parameter's gradient, for GPT-2, Llama and a mixture
// of experts, with and without activation checkpointing (and cpu_checkpointing's host copies),
// over two accumulated micro-batches, with the CPU streams delaying each work item at random so
// that a copy the stop left unwaited shows as a wrong result.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/model_registry.h"
#include "runtime/device/device.h"

namespace zrt {
namespace {

constexpr int kB = 2, kT = 16, kLayers = 5;

struct Pass {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  std::vector<std::string> log;
  std::int64_t device_activation_peak = 0;
  std::int64_t host_activation_peak = 0;
};

struct Setup {
  bool checkpointing = false;
  bool cpu_checkpointing = false;
};

// Two micro-batches accumulated; parameters of modules below `frozen_below` frozen (a tied one
// by its lowest module, as the engine counts it), and the backward ending at `first_backward`.
Pass run(const std::string& spec, const Setup& setup, DType dtype, int frozen_below,
         int first_backward) {
  DeviceOptions options;
  options.stream_delay_max_us = 50;
  std::unique_ptr<Device> device = make_device(options);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream);
  const auto def = builtin_models().parse_spec(spec);
  ModelOptions model_options;
  model_options.activation_checkpointing = setup.checkpointing;
  model_options.cpu_checkpointing = setup.cpu_checkpointing;
  const auto model = def->build(ctx, model_options);
  REQUIRE(model->stops_backward_early());
  std::vector<ParamSpec> specs = model->parameters();
  for (ParamSpec& p : specs) p.frozen = p.modules.front() < frozen_below;
  FlatParamAccess access(*device, *stream, specs, model->num_modules(), dtype, DType::kFloat32);
  access.init_from(*model, 7);
  access.set_first_backward_module(first_backward);
  const int vocab = def->vocab_size();
  const int N = kB * kT;
  std::vector<std::int32_t> tokens(N), targets(N);
  Buffer in = device->allocate(N * 4, MemCategory::kOther, "tokens");
  Buffer out = device->allocate(N * 4, MemCategory::kOther, "targets");
  Pass r;
  for (int micro = 0; micro < 2; ++micro) {
    for (int i = 0; i < N; ++i) {
      tokens[i] = (i * 7 + micro * 13) % vocab;
      targets[i] = i % 11 == 3 ? -1 : (i * 5 + micro + 1) % vocab;
    }
    device->copy_to_device(in.device<std::byte>(), tokens.data(), N * 4, *stream);
    device->copy_to_device(out.device<std::byte>(), targets.data(), N * 4, *stream);
    model->forward_backward(
        access,
        TokenBatch{in.device<const std::int32_t>(), out.device<const std::int32_t>(), kB, kT},
        1.0f);
    float loss = 0.f;
    device->copy_to_host(&loss, model->loss().as<const std::byte>(), sizeof loss, *stream);
    stream->synchronize();
    r.losses.push_back(loss);
  }
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) r.grads.push_back(access.read_grad(i));
  r.log = access.log();
  stream->synchronize();
  const auto idx = static_cast<std::size_t>(MemCategory::kActivations);
  r.device_activation_peak = device->tracker().usage(MemorySpace::kDevice).peak[idx];
  r.host_activation_peak = device->tracker().usage(MemorySpace::kPinnedHost).peak[idx];
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `hidden`: the residual stream's width.
void check_stop(const std::string& spec, int hidden) {
  const auto def = builtin_models().parse_spec(spec);
  const std::vector<ParamSpec> specs = def->parameters();
  const int M = def->num_modules();  // embedding, kLayers blocks, head
  REQUIRE(M == kLayers + 2);
  for (const Setup setup : {Setup{false, false}, Setup{true, false}, Setup{true, true}}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      // From the embedding frozen alone (k = 1) to the head alone trained (k = M - 1).
      for (int k = 1; k < M; ++k) {
        INFO(spec << ": checkpointing " << setup.checkpointing << ", cpu_checkpointing "
                  << setup.cpu_checkpointing << ", " << dtype_name(dtype)
                  << ", backward from module " << k);
        const Pass whole = run(spec, setup, dtype, k, 0);
        const Pass stopped = run(spec, setup, dtype, k, k);
        CHECK(same_bits(whole.losses, stopped.losses));
        for (std::size_t i = 0; i < specs.size(); ++i) {
          INFO(specs[i].name);
          if (specs[i].modules.front() >= k) {
            CHECK(same_bits(whole.grads[i], stopped.grads[i]));
          } else {
            // Frozen, and below the stop nothing writes it at all.
            const std::vector<float> zeros(stopped.grads[i].size(), 0.f);
            if (specs[i].modules.back() < k) CHECK(same_bits(stopped.grads[i], zeros));
          }
        }
        // The whole backward visits every module; the stopped one none below k, k itself last.
        int backward = 0, recompute = 0;
        for (const std::string& line : stopped.log) {
          for (int m = 0; m < M; ++m) {
            if (line == "acquire " + std::to_string(m) + " backward") {
              ++backward;
              CHECK(m >= k);
            }
            if (line == "acquire " + std::to_string(m) + " recompute") {
              ++recompute;
              CHECK(m >= k);
            }
          }
        }
        CHECK(backward == 2 * (M - k));
        // The blocks at and above k rerun (the head is not a block).
        CHECK(recompute == (setup.checkpointing ? 2 * (M - 1 - k) : 0));
        CHECK(stopped.log.back() == "release " + std::to_string(k) + " backward");
        // What the blocks below keep is the forward's scratch: one kept set for all of them
        // (without checkpointing), two rows of the residual stream, and no host copies of their
        // inputs. The peaks are what zrt-mem counts for that first backward module, and lower.
        ModelOptions counted;
        counted.activation_checkpointing = setup.checkpointing;
        counted.cpu_checkpointing = setup.cpu_checkpointing;
        const ActivationFootprint all = def->activation_footprint(kB, kT, dtype, counted);
        counted.planned_first_backward_module = k;
        const ActivationFootprint some = def->activation_footprint(kB, kT, dtype, counted);
        CHECK(whole.device_activation_peak == all.device);
        CHECK(stopped.device_activation_peak == some.device);
        CHECK(stopped.host_activation_peak == some.pinned_host);
        const std::int64_t row = std::int64_t{kB} * kT * hidden * dtype_size(dtype);
        const int first_block = k - 1;
        if (setup.cpu_checkpointing) {
          // The host holds blocks first_block .. L-3's inputs.
          CHECK(whole.host_activation_peak == (kLayers - 2) * row);
          CHECK(stopped.host_activation_peak == std::max(0, kLayers - 2 - first_block) * row);
          CHECK(stopped.device_activation_peak == whole.device_activation_peak);
        } else if (setup.checkpointing) {
          // Residual rows 2 .. first_block - 1 alias the first two.
          CHECK(whole.device_activation_peak - stopped.device_activation_peak ==
                std::max(0, first_block - 2) * row);
        } else if (first_block >= 2) {
          CHECK(stopped.device_activation_peak < whole.device_activation_peak);
        } else {  // block 0 alone below: its own kept set and rows, as before
          CHECK(stopped.device_activation_peak == whole.device_activation_peak);
        }
      }
    }
  }
}

TEST_CASE("a frozen lower half: GPT-2's backward stops at the first trained block, same bits") {
  check_stop("gpt2-tiny:n_layer=5,seq_len=16,vocab_size=96", 64);
}

TEST_CASE("a frozen lower half: Llama's backward stops at the first trained block, same bits") {
  check_stop("llama-tiny:num_hidden_layers=5,seq_len=16,max_position_embeddings=16,vocab_size=96",
             64);
}

// Dense layers (1 and 3) among the MoE ones, with a shared expert: the kept sets the blocks below
// share serve both kinds.
TEST_CASE("a frozen lower half: a mixed dense / MoE model stops at the first trained block") {
  check_stop(
      "qwen2_moe:hidden_size=32,intermediate_size=48,num_hidden_layers=5,num_attention_heads=4,"
      "num_key_value_heads=2,vocab_size=96,max_position_embeddings=16,num_experts=4,"
      "num_experts_per_tok=2,moe_intermediate_size=16,shared_expert_intermediate_size=24,"
      "norm_topk_prob=false,mlp_only_layers=1+3,router_aux_loss_coef=0.02",
      32);
}

TEST_CASE("a frozen lower half: a mixture's backward stops at the first trained block, same bits") {
  check_stop(
      "qwen3_moe:hidden_size=32,intermediate_size=48,num_hidden_layers=5,num_attention_heads=4,"
      "num_key_value_heads=2,head_dim=8,vocab_size=96,max_position_embeddings=16,"
      "num_experts=8,num_experts_per_tok=3,moe_intermediate_size=12,norm_topk_prob=true,"
      "router_aux_loss_coef=0.02",
      32);
}

}  // namespace
}  // namespace zrt
