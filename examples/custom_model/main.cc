// custom_model: trains ByteMlp (byte_mlp.h), a model of this project's own, with zrt's ZeRO
// engine and training loop, as zrt-train trains the models of zrt's registry.
//
//   mpirun -n 2 custom_model --config config.json      (or: zrt-run -n 2 custom_model --config ...)
//
// The run is zrt-train's: the config (DeepSpeed schema) sets the ZeRO stage, batch, optimizer,
// data and output_dir, where rank 0 writes metrics.jsonl. The model block's vocab_size, seq_len
// and n_embd size the MLP (hidden width 4 x n_embd); zrt's config validation also asks for
// n_layer and n_head, which this model does not use.
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>
#include <zrt/trainer.h>

#include "byte_mlp.h"

namespace {

custom_model::ByteMlpDims dims_from(const zrt::ModelConfig& model) {
  if (!model.vocab_size || !model.seq_len || !model.n_embd) {
    throw zrt::InvalidArgument("model: the byte MLP needs vocab_size, seq_len and n_embd");
  }
  custom_model::ByteMlpDims dims;
  dims.vocab_size = *model.vocab_size;
  dims.seq_len = *model.seq_len;
  dims.width = *model.n_embd;
  dims.hidden = 4 * dims.width;
  return dims;
}

zrt::ModelFactory byte_mlp_factory(const custom_model::ByteMlpDims& dims) {
  zrt::ModelFactory factory;
  factory.seq_len = dims.seq_len;
  factory.vocab_size = dims.vocab_size;
  factory.description = dims.describe();
  factory.build = [dims](zrt::kernels::KernelContext& ctx, const zrt::ModelOptions& options) {
    if (options.activation_checkpointing) {
      throw zrt::InvalidArgument(
          "model.activation_checkpointing: the byte MLP has nothing to "
          "recompute; leave it false");
    }
    return std::make_unique<custom_model::ByteMlp>(dims, ctx);
  };
  // Forward and backward: 2 and 4 FLOPs per multiply-add of the two matrices.
  factory.flops_per_token = [dims](int) {
    return 6.0 * (static_cast<double>(dims.width) * dims.hidden +
                  static_cast<double>(dims.hidden) * dims.vocab_size);
  };
  return factory;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--config") {
    std::fprintf(stderr, "usage: %s --config FILE.json   (under mpirun, one process per rank)\n",
                 argv[0]);
    return 2;
  }
  const std::string config_path = argv[2];
  zrt::MpiRuntime mpi(&argc, &argv);
  zrt::init_logging(mpi.rank());
  try {
    const zrt::Config config = zrt::load_config(config_path, mpi.size());
    zrt::init_logging(mpi.rank(), config.log_level);
    const zrt::Trainer trainer(config, mpi);
    const zrt::RunSummary summary = trainer.run(byte_mlp_factory(dims_from(config.model)));
    if (mpi.rank() == 0 && !summary.losses.empty()) {
      spdlog::info("custom_model: {} steps, loss {:.4f} -> {:.4f}", summary.steps,
                   summary.losses.front(), summary.losses.back());
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    // Other ranks may wait in a collective: end the whole job rather than let them time out.
    spdlog::default_logger()->flush();
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  return 0;
}
