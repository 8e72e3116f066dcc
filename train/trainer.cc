#include "train/trainer.h"

#include <functional>
#include <memory>
#include <utility>

#include "models/model_registry.h"
#include "train/training_run.h"

namespace zrt::train {

namespace {

// Both run_training()s. `make_factory` is called where the model is built (after the device and
// the process groups), so a bad model block fails there as it always has.
RunSummary train(const Config& config, const RankInfo& ranks,
                 std::function<ModelFactory()> make_factory, const TrainHooks& hooks) {
  TrainingRun run(config, ranks, std::move(make_factory), hooks);
  run.build();
  return run.run();
}

}  // namespace

ModelFactory registry_model(const ModelConfig& model) {
  std::shared_ptr<const ModelDef> def = builtin_models().resolve(model);
  ModelFactory factory;
  factory.seq_len = def->seq_len();
  factory.vocab_size = def->vocab_size();
  factory.description = def->describe();
  factory.build = [def](kernels::KernelContext& ctx, const ModelOptions& options) {
    return def->build(ctx, options);
  };
  factory.flops_per_token = [def](int seq_len) { return def->flops_per_token(seq_len); };
  factory.initializer = [def](const Model& built, std::uint64_t seed,
                              const std::string& init_from) {
    return def->initializer(built, seed, init_from);
  };
  return factory;
}

RunSummary run_training(const Config& config, const RankInfo& ranks, const TrainHooks& hooks) {
  return train(
      config, ranks, [&config] { return registry_model(config.model); }, hooks);
}

RunSummary run_training(const Config& config, const RankInfo& ranks, const ModelFactory& model,
                        const TrainHooks& hooks) {
  return train(
      config, ranks, [&model] { return model; }, hooks);
}

}  // namespace zrt::train
