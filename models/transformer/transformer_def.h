// TransformerDef: the part of a registry entry's ModelDef (models/model_registry.h) that every
// model on the shared driver (transformer_model.h) answers the same way: its module count, the
// modules activation checkpointing reruns (the blocks), building it with the run's options, and
// its own random initialisation when there are no weights to read. A model's def gives its
// number of blocks, how to build it and how to read Hugging Face weights into it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/model_registry.h"
#include "models/transformer/transformer_spec.h"

namespace zrt::transformer {

// The driver's options for a model built with `options`.
TransformerOptions transformer_options(const ModelOptions& options);

// The kernel workspace a training step leaves when its largest requests are the attention's:
// `forward` bytes (every forward, recomputation and evaluation pass), then `backward` bytes,
// grown as KernelContext::workspace grows (ModelDef::kernel_workspace_bytes).
std::int64_t attention_workspace_growth(std::int64_t forward, std::int64_t backward);

class TransformerDef : public ModelDef {
 public:
  int num_modules() const override { return transformer::num_modules(n_layer()); }
  std::vector<int> recomputed_modules() const override { return block_modules(n_layer()); }
  bool stops_backward_early() const override { return true; }
  bool skips_frozen_gradients() const override { return true; }
  std::unique_ptr<Model> build(kernels::KernelContext& ctx,
                               const ModelOptions& options) const override;
  // Reads `init_from` when it is set (hf_weights_initializer), else model.init_parameter from
  // `seed`.
  ParamInitializer initializer(const Model& model, std::uint64_t seed,
                               const std::string& init_from) const override;

 protected:
  virtual int n_layer() const = 0;
  virtual std::unique_ptr<Model> build_model(kernels::KernelContext& ctx,
                                             const TransformerOptions& options) const = 0;
  // The initial values read from a Hugging Face file or directory (never empty).
  virtual ParamInitializer hf_weights_initializer(const Model& model,
                                                  const std::string& init_from) const = 0;
};

// A TransformerDef over a model's config (`Config`: name, seq_len, vocab_size, describe(),
// num_parameters(), validate()) and its model (`ModelType`: parameter_table(config) and a
// (config, ctx, options) constructor): the hooks that read straight off the two. `Derived`, the
// def itself, is what with_seq_len returns.
template <class Derived, class Config, class ModelType>
class TransformerDefOf : public TransformerDef {
 public:
  explicit TransformerDefOf(Config config) : config_(std::move(config)) {}

  std::string name() const override { return config_.name; }
  std::string describe() const override { return config_.describe(); }
  int seq_len() const override { return config_.seq_len; }
  int vocab_size() const override { return config_.vocab_size; }
  std::unique_ptr<ModelDef> with_seq_len(int seq_len) const override {
    Config config = config_;
    config.seq_len = seq_len;  // validate() bounds it (GPT-2's wpe has seq_len rows)
    config.validate();
    return std::make_unique<Derived>(std::move(config));
  }
  std::vector<ParamSpec> parameters() const override { return ModelType::parameter_table(config_); }
  std::vector<std::string> sequence_parallel_problems(int sp) const override {
    return ModelType::sequence_parallel_problems(config_, sp);
  }
  std::int64_t num_parameters() const override { return config_.num_parameters(); }

 protected:
  const Config& config() const { return config_; }
  std::unique_ptr<Model> build_model(kernels::KernelContext& ctx,
                                     const TransformerOptions& options) const override {
    return std::make_unique<ModelType>(config_, ctx, options);
  }

 private:
  Config config_;
};

}  // namespace zrt::transformer
