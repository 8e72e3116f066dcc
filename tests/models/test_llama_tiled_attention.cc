// A training step of a small Llama at a sequence long enough that the CPU attention takes its
// tiled path (kernels/cpu/attention_path.h), against the same step with ZRT_CPU_ATTENTION=full
// (today's kernel): llama-tiny (2 blocks, 4 query heads over 2 key/value heads of 16, vocabulary
// 256) at T = 1024, B = 1, fp32.
//
// The bound. Everything but attention runs the same operations on both sides; each attention
// call's out, lse and input gradients differ by at most the per-element bound the kernel test
// derives and checks (tests/kernels/test_tiled_attention.cc: the forward error analysis of
// attention_order_bounds.h, a few units of fp32 rounding, g(n) = n u / (1 - n u), relative to the
// magnitudes summed). The rest of the step carries such a perturbation through to the loss and
// the gradients like any other fp32 rounding of the step: test_llama measures the whole fp32 step
// (its own rounding, sums of up to B*T = 12 rows and C = 64) within 1e-5 relative of float64;
// here the longest sums run over T = 1024 keys and rows, so by g(n)'s linear growth in n the
// step's rounding is at most 1024 / 12 times larger, and two fp32 evaluations differ by at most
// twice one's error: 2 * 1e-5 * 1024 / 12 = 1.7e-3 relative per tensor. The loss, a mean of 1024
// rows, gets the same bound. The check also requires the two steps to differ (the paths did
// switch) and the tiled one to be the rule's choice at this shape.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention_path.h"
#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/llama/llama.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt {
namespace {

constexpr int kT = 1024;
constexpr std::uint64_t kSeed = 3902;

struct StepRig {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  kernels::KernelContext ctx{*device, *stream};
  std::unique_ptr<llama::Llama> model;
  std::unique_ptr<FlatParamAccess> access;
  Buffer tokens, targets;
  TokenBatch batch;

  StepRig() {
    const llama::LlamaConfig c =
        llama::LlamaConfig::parse("llama", "llama-tiny:max_position_embeddings=1024,seq_len=1024");
    model = std::make_unique<llama::Llama>(c, ctx, transformer::TransformerOptions{});
    const auto& params = model->parameters();
    access = std::make_unique<FlatParamAccess>(*device, *stream, params, model->num_modules(),
                                               DType::kFloat32, DType::kFloat32);
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      const bool norm = params[i].name.find("norm") != std::string::npos;
      access->set_param(i, test::cast_vector<float>(test::normal_values(
                               kSeed, i, params[i].numel(), norm ? 0.1 : 0.2, norm ? 1.0 : 0.0)));
    }
    const auto in = test::token_values(kSeed, 1000, kT, c.vocab_size);
    const auto tgt = test::token_values(kSeed, 1001, kT, c.vocab_size);
    const auto bytes = static_cast<std::int64_t>(kT * sizeof(std::int32_t));
    tokens = device->allocate(bytes, MemCategory::kOther, "tokens");
    targets = device->allocate(bytes, MemCategory::kOther, "targets");
    device->copy_to_device(tokens.device<std::byte>(), in.data(), bytes, *stream);
    device->copy_to_device(targets.device<std::byte>(), tgt.data(), bytes, *stream);
    stream->synchronize();
    batch = TokenBatch{tokens.device<const std::int32_t>(), targets.device<const std::int32_t>(), 1,
                       kT};
  }
  ~StepRig() { stream->synchronize(); }
};

struct StepResult {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

StepResult train_step() {
  StepRig rig;
  rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
  StepResult r{rig.model->read_loss(), {}};
  for (int i = 0; i < static_cast<int>(rig.model->parameters().size()); ++i) {
    r.grads.push_back(rig.access->read_grad(i));
  }
  return r;
}

}  // namespace

TEST_CASE("A Llama step on the tiled CPU attention equals today's kernel within the bound") {
  REQUIRE(std::getenv("ZRT_CPU_ATTENTION") == nullptr);
  // The rule's choice at this shape: 2 * 4 pairs * 1024^2 * 4 bytes = 32 MiB of scores.
  REQUIRE(kernels::cpu::resolve_attention_path(kernels::cpu::AttentionPath::kAuto, 1, kT, 4, 4) ==
          kernels::cpu::AttentionPath::kTiled);
  const StepResult tiled = train_step();
  setenv("ZRT_CPU_ATTENTION", "full", 1);
  const StepResult full = train_step();
  unsetenv("ZRT_CPU_ATTENTION");
  const double bound = 2 * 1e-5 * kT / 12;
  INFO("loss " << tiled.loss << " against " << full.loss);
  CHECK(std::abs(tiled.loss - full.loss) <= bound * std::abs(full.loss));
  REQUIRE(tiled.grads.size() == full.grads.size());
  bool any_differs = false;
  for (std::size_t i = 0; i < full.grads.size(); ++i) {
    const double err = test::rel_error(tiled.grads[i], full.grads[i]);
    INFO("gradient " << i << ": relative error " << err);
    CHECK(err <= bound);
    any_differs = any_differs || tiled.grads[i] != full.grads[i];
  }
  CHECK(any_differs);
}

}  // namespace zrt
