// ByteMlp: a small language model over byte tokens that is not a transformer. Each position
// predicts the next byte from its own token and position only:
//   x = token_embedding[byte] + position_embedding[t]      (C)
//   h = gelu(x @ hidden.weight + hidden.bias)               (H = 4 C)
//   logits = h @ head.weight + head.bias                    (V = 256)
//   loss = mean cross-entropy of logits against the next byte
// It is written on zrt's kernels (zrt::kernels::*), which run on the CPU or the GPU the run
// picked, and implements zrt::Model, so the ZeRO engine owns (and at stage 3 shards) its
// parameters and gradients.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zrt/model.h>

namespace custom_model {

struct ByteMlpDims {
  int vocab_size = 256;  // V
  int seq_len = 64;      // T: the longest sequence, the size of the position embedding
  int width = 64;        // C
  int hidden = 256;      // H

  std::int64_t num_parameters() const;
  std::string describe() const;
};

class ByteMlp final : public zrt::Model {
 public:
  // The modules in forward order; ParamAccess::acquire/release are called per module.
  enum Module { kEmbedding = 0, kHidden = 1, kHead = 2, kNumModules = 3 };

  // Throws zrt::InvalidArgument for dimensions that are not positive.
  ByteMlp(ByteMlpDims dims, zrt::kernels::KernelContext& ctx);

  const std::vector<zrt::ParamSpec>& parameters() const override { return params_; }
  int num_modules() const override { return kNumModules; }
  void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                      float* out) const override;
  void forward_backward(zrt::ParamAccess& access, const zrt::TokenBatch& batch,
                        float loss_scale) override;
  void forward(zrt::ParamAccess& access, const zrt::TokenBatch& batch) override;
  zrt::DevicePtr<const float> loss() const override { return loss_.device<float>(); }
  zrt::DevicePtr<const std::byte> logits() const override { return acts_.logits; }

 private:
  // Activations of one pass and their gradients, carved from one buffer.
  struct Activations {
    zrt::DevicePtr<std::byte> x, pre, h, logits;  // compute dtype
    zrt::DevicePtr<std::byte> dx, dpre, dh;       // compute dtype
    zrt::DevicePtr<float> losses;                 // (N) fp32
  };

  // Checks the batch and (re)lays out the activations for its shape and the run's dtypes.
  void prepare(zrt::ParamAccess& access, const zrt::TokenBatch& batch, bool need_targets);
  void run_forward(zrt::ParamAccess& access, const zrt::TokenBatch& batch, zrt::Phase phase);

  ByteMlpDims dims_;
  zrt::kernels::KernelContext& ctx_;
  std::vector<zrt::ParamSpec> params_;
  zrt::Buffer loss_;
  zrt::Buffer act_buffer_;
  Activations acts_;
  int batch_ = 0;
  int seq_len_ = 0;
  zrt::DType dtype_ = zrt::DType::kFloat32;
  zrt::DType grad_dtype_ = zrt::DType::kFloat32;
};

}  // namespace custom_model
