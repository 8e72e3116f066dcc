// zrt-train: trains a GPT with the ZeRO engine, as one JSON config describes.
//   mpirun -n N zrt-train --config run.json      (or: tools/zrt-run -n N run.json)
// Exit status: 0 done; 1 an error (the job is aborted); 2 bad arguments; 3 the watchdog ended
// a hung job (a collective past comm_timeout_s: a rank died, froze or diverged).
#include <cstdio>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/log.h"
#include "runtime/config/config.h"
#include "tools/train/trainer.h"

namespace {
void usage() {
  std::fprintf(stderr,
               "usage: zrt-train --config FILE.json\n"
               "  runs under mpirun (tools/zrt-run -n N FILE.json); see docs/config.md\n");
}
}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config_path = argv[++i];
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "zrt-train: unexpected argument '%s'\n", argv[i]);
      usage();
      return 2;
    }
  }
  if (config_path.empty()) {
    usage();
    return 2;
  }
  try {
    zrt::MpiRuntime mpi(&argc, &argv);
    zrt::init_logging(mpi.rank());
    try {
      const zrt::Config config = zrt::load_config(config_path, mpi.size());
      zrt::init_logging(mpi.rank(), config.log_level);
      zrt::train::TrainHooks hooks;
      // A hang (an operation past comm_timeout_s, reported by the watchdog with the operation,
      // the step and the ranks missing, already logged): end the whole job now, from whichever
      // thread saw it, rather than unwind through other waits that may block too.
      hooks.on_hang = [](const std::string&) {
        spdlog::default_logger()->flush();
        MPI_Abort(MPI_COMM_WORLD, 3);
      };
      zrt::train::run_training(config, mpi, hooks);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      // The other ranks may be waiting in a collective: end the whole job now rather than let
      // them time out.
      spdlog::default_logger()->flush();
      MPI_Abort(MPI_COMM_WORLD, 1);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zrt-train: %s\n", e.what());
    return 1;
  }
  return 0;
}
