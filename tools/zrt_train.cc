// zrt-train: trains a model with the ZeRO engine, as one JSON config describes.
//
//   mpirun -n N zrt-train --config run.json [--train.steps 5 ...]
//   tools/zrt-run -n N run.json [--train.steps 5 ...]               (the same, wrapped)
//   zrt-train --check --config run.json [--world N]                   (validate, no mpirun)
//
// Exit status: 0 done; 1 an error (the job is aborted; with --check: the config is invalid or
// does not fit); 2 bad arguments; 3 the watchdog ended a hung job (a collective past
// comm_timeout_s: a rank died, froze or diverged); 75 preempted: SIGTERM, SIGINT or SIGUSR1
// reached a rank, every rank stopped at the next step boundary and a checkpoint of that step
// was saved (requeue the job: checkpoint.load "auto" resumes from it); 76 preempted without a
// new checkpoint: a second signal, checkpoint.preempt_grace_s ran out, or the save failed under
// checkpoint.on_save_error "continue" (the previous checkpoint is intact; requeue too).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "config/config.h"
#include "kernels/cpu/gemm.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/error.h"
#include "runtime/common/log.h"
#include "tools/train_check.h"
#include "train/trainer.h"

#ifndef ZRT_VERSION
#define ZRT_VERSION "unknown"
#endif
#ifndef ZRT_GIT_DESCRIBE
#define ZRT_GIT_DESCRIBE ""
#endif

namespace {

const char* kUsage = R"(usage: zrt-train --config FILE.json [--KEY VALUE ...]
       zrt-train --check --config FILE.json [--world N] [--KEY VALUE ...]
       zrt-train --version | --help | --blas-core

Trains a model with the ZeRO engine as the config describes (DeepSpeed's keys plus zrt's blocks).
It runs under mpirun, one process per rank; the world size is the number of ranks:
  tools/zrt-run -n 4 run.json --train.steps 5     (mpirun -n 4 zrt-train --config run.json ...)

options:
  --config FILE       the run's JSON config; guide: docs/config.md, every key:
                      docs/config-keys.md
  --KEY VALUE, --KEY=VALUE
                      set config key KEY (a dotted path; blocks are created as needed) over
                      the file, e.g. --train.steps 5, --zero_optimization.stage=3,
                      --optimizer.params.lr 3e-4, --zero_optimization.offload_optimizer
                      '{"device": "cpu"}'. VALUE is read as JSON when it is valid JSON
                      (numbers, true/false, null, lists, objects), else as a string; keys
                      that take a string always take the text. Checked like the file: a
                      problem names --KEY
  --check             validate the config (with the overrides) and print it resolved: the
                      batch rule solved, defaults filled in, warnings; then zrt-mem's memory
                      estimate for this model, setting and world size. Trains nothing and
                      needs no mpirun. Exit 0 if the config is valid and fits the device, 1
                      if not
  --world N           with --check: the number of ranks to check for (default: the file's
                      train_batch_size / (micro-batch x accumulation) when it gives all
                      three numbers, else 1)
  --version           print the version and exit
  --blas-core         print the OPENBLAS_CORETYPE this CPU should be given (an empty line when
                      OpenBLAS's own choice is right; tools/zrt-run asks this) and exit
  -h, --help          print this help and exit

Every problem of the config is reported in one run, the most fundamental first: unsupported
features and types, unknown keys, wrong types and ranges, missing keys, then combinations.

environment:
  ZRT_LOG_LEVEL       trace, debug, info, warn, error or off: the log threshold; wins over
                      the config's log_level
  ZRT_CPU_ISA         avx512, avx2 or scalar: run every CPU kernel on that path (default:
                      the widest this CPU has)

signals (docs/launching.md):
  SIGTERM, SIGINT, SIGUSR1 to any rank (mpirun forwards SIGUSR1; srun signals every task):
                      every rank stops at the next step boundary, saves a checkpoint of that
                      step and exits 75. A second signal, or checkpoint.preempt_grace_s
                      running out, exits 76 at once; `latest` is unchanged

exit status: 0 done (--check: valid and fits); 1 an error: an invalid config, a failed run
(--check: invalid or does not fit); 2 bad arguments; 3 the watchdog ended a hung job; 75
preempted, checkpoint saved (requeue); 76 preempted, no new checkpoint (requeue).
)";

// Exit statuses of a preempted run (sysexits' EX_TEMPFAIL: "try again later"), for requeue
// scripts (docs/launching.md).
constexpr int kExitPreempted = 75;
constexpr int kExitPreemptedUnsaved = 76;

// The preemption signals' state. Process-wide by nature (a signal handler has no other way to
// reach the program); lock-free atomics, so the handlers stay async-signal-safe.
std::atomic<int> g_stop_signals{0};  // preemption signals received
std::atomic<int> g_first_signal{0};  // the first one's number, for the log
std::atomic<bool> g_grace_armed{false};
std::atomic<unsigned> g_grace_s{0};  // checkpoint.preempt_grace_s rounded up; 0: no timer
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free &&
              std::atomic<unsigned>::is_always_lock_free);

// write(2) of a constant message: the one output a signal handler may make.
void say(const char* message) {
  const ssize_t ignored = ::write(STDERR_FILENO, message, std::strlen(message));
  (void)ignored;
}

// Starts checkpoint.preempt_grace_s once (the first signal, or the run's agreement to stop on
// a rank that received none); SIGALRM then ends the process.
void arm_grace_timer() {
  const unsigned seconds = g_grace_s.load();
  if (seconds > 0 && !g_grace_armed.exchange(true)) ::alarm(seconds);
}

void on_stop_signal(int signal) {
  if (g_stop_signals.fetch_add(1) == 0) {
    g_first_signal.store(signal);
    arm_grace_timer();
    return;  // the training loop sees the flag at its next step boundary
  }
  say("zrt-train: a second preemption signal: exiting now (status 76) without a new "
      "checkpoint; `latest` is unchanged (it names the previous checkpoint, if there is one)\n");
  ::_exit(kExitPreemptedUnsaved);
}

void on_grace_timeout(int) {
  say("zrt-train: checkpoint.preempt_grace_s ran out before the save-and-exit finished: exiting "
      "now (status 76); `latest` is unchanged (it names the previous checkpoint, if there is "
      "one)\n");
  ::_exit(kExitPreemptedUnsaved);
}

void install_stop_signals(double grace_s) {
  g_grace_s.store(grace_s > 0.0 ? static_cast<unsigned>(std::ceil(grace_s)) : 0u);
  struct sigaction action {};
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // the other threads' system calls go on
  action.sa_handler = on_stop_signal;
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal, &action, nullptr);
  action.sa_handler = on_grace_timeout;
  sigaction(SIGALRM, &action, nullptr);
}

struct Arguments {
  std::string config_path;
  zrt::ConfigOverrides overrides;
  bool check = false;
  std::optional<int> world;
};

// Thrown for bad command-line usage (exit status 2).
struct UsageError {
  std::string message;
};

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

int parse_world(const std::string& text) {
  try {
    std::size_t used = 0;
    const long value = std::stol(text, &used);
    if (used == text.size() && value >= 1 && value <= 1000000) return static_cast<int>(value);
  } catch (const std::exception&) {
  }
  throw UsageError{"--world needs a positive integer, not '" + text + "'"};
}

// Returns nullopt when the program should exit 0 at once (--help, --version: printed here).
std::optional<Arguments> parse_arguments(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return std::nullopt;
    }
    if (arg == "--version") {
      const std::string git = ZRT_GIT_DESCRIBE;
      std::printf("zrt-train %s%s\n", ZRT_VERSION,
                  git.empty() ? "" : (" (git " + git + ")").c_str());
      return std::nullopt;
    }
    if (arg == "--blas-core") {
      std::printf("%s\n", zrt::kernels::cpu::suggested_blas_core().c_str());
      return std::nullopt;
    }
    if (arg == "--check") {
      args.check = true;
      continue;
    }
    if (!starts_with(arg, "--") || arg.size() == 2) {
      throw UsageError{"unexpected argument '" + arg + "'" +
                       (arg.size() > 5 && arg.substr(arg.size() - 5) == ".json"
                            ? " (the config is given as --config " + arg + ")"
                            : "")};
    }
    // --NAME=VALUE or --NAME VALUE.
    std::string name = arg.substr(2);
    std::string value;
    if (const std::size_t equals = name.find('='); equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    } else {
      // A value never starts with "--" ("-1" is fine): such an argument is the next option.
      if (i + 1 >= argc || starts_with(argv[i + 1], "--")) {
        throw UsageError{"--" + name + " needs a value (--" + name + " VALUE or --" + name +
                         "=VALUE)"};
      }
      value = argv[++i];
    }
    if (name == "config") {
      args.config_path = value;
    } else if (name == "world") {
      args.world = parse_world(value);
    } else {
      args.overrides.emplace_back(name, value);  // a config key: validated with the file
    }
  }
  if (args.config_path.empty()) throw UsageError{"--config FILE is required"};
  if (args.world && !args.check) {
    throw UsageError{"--world is for --check; under mpirun the world size is the number of ranks"};
  }
  return args;
}

// One log line per problem (a config may have several), each with the rank prefix.
void log_error_lines(const std::string& prefix, const std::string& text) {
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    spdlog::error("{}{}", prefix, text.substr(begin, end - begin));
    begin = end + 1;
  }
}

int train(const Arguments& args, int* argc, char*** argv) {
  zrt::MpiRuntime mpi(argc, argv);
  zrt::init_logging(mpi.rank());
  bool configured = false;
  zrt::cli::ConfigDocument d;
  try {
    d = zrt::cli::read_config_document(args.config_path, args.overrides);
    const zrt::Config config =
        zrt::parse_config(d.json, mpi.size(), args.config_path, d.command_line_paths);
    configured = true;
    zrt::init_logging(mpi.rank(), config.log_level);
    zrt::train::TrainHooks hooks;
    // A hang (an operation past comm_timeout_s, reported by the watchdog with the operation,
    // the step and the ranks missing, already logged): end the whole job now, from whichever
    // thread saw it, rather than unwind through other waits that may block too.
    hooks.on_hang = [](const std::string&) {
      spdlog::default_logger()->flush();
      MPI_Abort(MPI_COMM_WORLD, 3);
    };
    // Preemption (docs/launching.md): the handlers only count signals; the loop polls the
    // count at each step boundary and every rank agrees on it through the loss all-reduce.
    install_stop_signals(config.checkpoint.preempt_grace_s);
    if (g_stop_signals.load() > 0) arm_grace_timer();  // a signal during the start-up
    hooks.stop_requested = [] { return g_stop_signals.load(std::memory_order_relaxed) > 0; };
    hooks.on_stop = [](std::int64_t step) {
      arm_grace_timer();
      if (const int signal = g_first_signal.load(); signal != 0) {
        spdlog::warn("received {} before step {}'s boundary", strsignal(signal), step);
      }
    };
    const zrt::train::RunSummary summary = zrt::train::run_training(config, mpi, hooks);
    switch (summary.status) {
      case zrt::train::RunStatus::kCompleted:
        break;
      case zrt::train::RunStatus::kPreempted:
        spdlog::default_logger()->flush();
        return kExitPreempted;
      case zrt::train::RunStatus::kPreemptedUnsaved:
        spdlog::default_logger()->flush();
        return kExitPreemptedUnsaved;
      case zrt::train::RunStatus::kCompletedUnsaved:  // the run logged why
        spdlog::default_logger()->flush();
        return 1;
    }
  } catch (const std::exception& e) {
    // A config's problems are the same on every rank (one file, one world size): rank 0
    // reports them and ends the job, and the others wait for that rather than print the same
    // list once per rank. One whose rank 0 did not fail (a file that differs between nodes)
    // reports its own after the wait.
    if (!configured && mpi.rank() != 0) {
      std::this_thread::sleep_for(std::chrono::seconds(5));
    }
    log_error_lines("", e.what());
    // The model's problems with the config's, as --check lists them, so one failed start
    // names both.
    if (!configured && dynamic_cast<const zrt::InvalidArgument*>(&e) != nullptr) {
      const std::string model = zrt::cli::model_problems_beside(d, mpi.size(), args.config_path);
      if (!model.empty()) log_error_lines(args.config_path + ": model: ", model);
    }
    // The other ranks may be waiting in a collective: end the whole job now rather than let
    // them time out. A wait past comm.timeout_s (a rank died or hangs: during a checkpoint's
    // agreement, the load plan, ...) is the watchdog's status, 3, whichever wait saw it.
    const int status = dynamic_cast<const zrt::Timeout*>(&e) != nullptr ? 3 : 1;
    spdlog::default_logger()->flush();
    MPI_Abort(MPI_COMM_WORLD, status);
    return status;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The preemption handlers first of all: a signal during MPI's start-up or the config's read
  // (seconds on a large job) is counted and honoured at the first step boundary (a checkpoint,
  // status 75) instead of killing the rank with the signal's default action (status 143, which
  // requeue scripts do not take for a preemption). The grace period is set once the config is.
  install_stop_signals(0.0);
  std::optional<Arguments> args;
  try {
    args = parse_arguments(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "zrt-train: %s\n(zrt-train --help for usage)\n", e.message.c_str());
    return 2;
  }
  if (!args) return 0;
  try {
    if (args->check) {
      // The report lists the config's warnings itself; the log adds only errors (unless
      // ZRT_LOG_LEVEL asks for more).
      zrt::init_logging(0, "error");
      return zrt::cli::check_training_config({args->config_path, args->overrides, args->world});
    }
    return train(*args, &argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zrt-train: %s\n", zrt::error_text(e).c_str());
    return 1;
  }
}
