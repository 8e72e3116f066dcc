// activation_checkpointing.cpu_checkpointing (models/transformer/checkpoint_offload.h): the
// block inputs checkpointing keeps, in pinned host memory, give the same bits as keeping them on
// the device (losses and every gradient, over two accumulated micro-batches, GPT-2 and Llama, fp32
// and bf16), with the CPU streams delaying each work item at random so that a missing event wait
// shows as a wrong result; and the tracked device peak of the activations is lower by exactly the
// offloaded block inputs, which the pinned host memory holds.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "models/transformer/checkpoint_offload.h"
#include "runtime/device/device.h"

namespace zrt {
namespace {

constexpr int kB = 2, kT = 16, kLayers = 5;

gpt::GptConfig gpt_config() {
  gpt::GptConfig c;
  c.n_layer = kLayers;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 96;
  c.seq_len = kT;
  return c;
}

llama::LlamaConfig llama_config() {
  llama::LlamaConfig c;
  c.name = "custom";
  c.architecture = "llama";
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = kLayers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 96;
  c.max_position_embeddings = kT;
  c.seq_len = kT;
  return c;
}

struct Result {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  std::int64_t device_activation_peak = 0;
  std::int64_t device_total_peak = 0;
  std::int64_t host_activation_peak = 0;
};

// Two micro-batches accumulated, as the engine runs them.
template <class ModelT, class Config>
Result train(const Config& config, DType dtype, bool cpu_checkpointing) {
  DeviceOptions options;
  options.stream_delay_max_us = 50;  // a missing wait on the copy stream shows as wrong bits
  std::unique_ptr<Device> device = make_device(options);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream);
  transformer::TransformerOptions model_options;
  model_options.activation_checkpointing = true;
  model_options.cpu_checkpointing = cpu_checkpointing;
  ModelT model(config, ctx, model_options);
  FlatParamAccess access(*device, *stream, model.parameters(), model.num_modules(), dtype,
                         DType::kFloat32);
  access.init_from(model, 7);
  const int N = kB * kT;
  std::vector<std::int32_t> tokens(N), targets(N);
  Buffer in = device->allocate(N * 4, MemCategory::kOther, "tokens");
  Buffer out = device->allocate(N * 4, MemCategory::kOther, "targets");
  Result r;
  for (int micro = 0; micro < 2; ++micro) {
    for (int i = 0; i < N; ++i) {
      tokens[i] = (i * 7 + micro * 13) % config.vocab_size;
      targets[i] = i % 11 == 3 ? -1 : (i * 5 + micro + 1) % config.vocab_size;
    }
    device->copy_to_device(in.device<std::byte>(), tokens.data(), N * 4, *stream);
    device->copy_to_device(out.device<std::byte>(), targets.data(), N * 4, *stream);
    const TokenBatch batch{in.device<const std::int32_t>(), out.device<const std::int32_t>(), kB,
                           kT};
    model.forward_backward(access, batch, 1.0f);
    r.losses.push_back(model.read_loss());
  }
  for (int i = 0; i < static_cast<int>(model.parameters().size()); ++i) {
    r.grads.push_back(access.read_grad(i));
  }
  stream->synchronize();
  const auto idx = static_cast<std::size_t>(MemCategory::kActivations);
  r.device_activation_peak = device->tracker().usage(MemorySpace::kDevice).peak[idx];
  r.device_total_peak = device->tracker().usage(MemorySpace::kDevice).total_peak;
  r.host_activation_peak = device->tracker().usage(MemorySpace::kPinnedHost).peak[idx];
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class ModelT, class Config>
void check_same_bits_and_bytes(const Config& config, int hidden) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    INFO(dtype_name(dtype));
    const Result on_device = train<ModelT>(config, dtype, false);
    const Result on_host = train<ModelT>(config, dtype, true);
    CHECK(same_bits(on_device.losses, on_host.losses));
    REQUIRE(on_device.grads.size() == on_host.grads.size());
    for (std::size_t i = 0; i < on_device.grads.size(); ++i) {
      INFO("parameter " << i);
      CHECK(same_bits(on_device.grads[i], on_host.grads[i]));
    }
    // L + 1 residual tensors on the device become 3: the L - 2 block inputs the host holds.
    const std::int64_t row = std::int64_t{kB} * kT * hidden * dtype_size(dtype);
    REQUIRE(row % kActivationAlign == 0);  // no rounding in the comparison
    CHECK(on_device.device_activation_peak - on_host.device_activation_peak == (kLayers - 2) * row);
    CHECK(on_device.device_total_peak - on_host.device_total_peak == (kLayers - 2) * row);
    CHECK(on_device.host_activation_peak == 0);
    CHECK(on_host.host_activation_peak == (kLayers - 2) * row);
  }
}

TEST_CASE(
    "cpu_checkpointing: GPT-2 gives the device checkpoints' bits, with L-2 block inputs "
    "on the host") {
  check_same_bits_and_bytes<gpt::Gpt>(gpt_config(), 64);
}

TEST_CASE(
    "cpu_checkpointing: Llama gives the device checkpoints' bits, with L-2 block inputs "
    "on the host") {
  check_same_bits_and_bytes<llama::Llama>(llama_config(), 64);
}

TEST_CASE("cpu_checkpointing offloads nothing without checkpointing or under three blocks") {
  transformer::TransformerOptions o;
  o.cpu_checkpointing = true;
  CHECK(transformer::offloaded_block_inputs(8, o) == 0);
  o.activation_checkpointing = true;
  CHECK(transformer::offloaded_block_inputs(8, o) == 6);
  CHECK(transformer::offloaded_block_inputs(2, o) == 0);
  CHECK(transformer::offloaded_block_inputs(1, o) == 0);
}

}  // namespace
}  // namespace zrt
