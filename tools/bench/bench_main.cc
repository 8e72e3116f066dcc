// zrt-bench: performance figures, printed as tables next to their references (see
// BENCHMARKS.md for recorded runs). Usage: zrt-bench <subcommand> [options].
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/bench/bench.h"

#include "runtime/common/error.h"

namespace zrt::bench {

namespace {
struct Entry {
  const char* name;
  Command run;
  const char* help;
};
constexpr Entry kCommands[] = {
    {"collectives", collectives,
     "all-gather / reduce-scatter time, algbw, busbw vs MPI_Allgather and "
     "MPI_Reduce_scatter_block (run under mpirun)"},
    {"step", step,
     "one GPT training step at ZeRO stages 0-3 with a simulated link: time, bytes, model-state "
     "peak, communication hidden (run under mpirun)"},
    {"optimizer", optimizer,
     "CPU AdamW params/s and GB/s (fp32, +bf16 copy-out) vs a read-4/write-3 memory sweep and "
     "torch.optim.AdamW"},
    {"model", model,
     "GPT-2 forward+backward tokens/s on the CPU kernels (gpt2-tiny, gpt2) vs PyTorch"},
    {"checkpoint", checkpoint,
     "sharded checkpoint save/load GB/s per rank vs a plain write/read with fsync, async-save "
     "stall (run under mpirun)"},
    {"offload", offload,
     "optimizer offload: step time vs forward+backward and CPU optimizer alone, the share "
     "hidden by overlap, host<->device copy GB/s (run under mpirun)"},
    {"startup", startup,
     "a large model's start-up host work: the weights' normal draws (ns/value vs libm), host "
     "memory made resident (vs one thread's memset; on a GPU vs cudaHostAlloc), fp32 -> bf16"},
    {"attention", attention,
     "causal attention forward/backward time and TFLOP/s (fused kernels on a GPU) vs PyTorch's "
     "scaled_dot_product_attention"},
};

void usage() {
  std::fprintf(stderr, "usage: zrt-bench <subcommand> [options]\nsubcommands:\n");
  for (const Entry& e : kCommands) std::fprintf(stderr, "  %-12s %s\n", e.name, e.help);
}
}  // namespace

Args::Args(int argc, char** argv, std::vector<std::string> known) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      values_.emplace_back("help", "");
      continue;
    }
    if (arg.rfind("--", 0) != 0) ZRT_THROW(InvalidArgument, "unexpected argument '{}'", arg);
    std::string key = arg.substr(2);
    std::string value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
    }
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const auto& k : known) list += " --" + k;
      ZRT_THROW(InvalidArgument, "unknown option '--{}'; known:{}", key, list);
    }
    values_.emplace_back(key, value);
  }
}

bool Args::has(const std::string& key) const {
  for (const auto& [k, v] : values_) {
    if (k == key) return true;
  }
  return false;
}

std::string Args::get(const std::string& key, const std::string& fallback) const {
  for (const auto& [k, v] : values_) {
    if (k == key) return v;
  }
  return fallback;
}

double Args::get_double(const std::string& key, double fallback) const {
  return has(key) ? std::stod(get(key, "")) : fallback;
}

std::int64_t Args::get_bytes(const std::string& key, std::int64_t fallback) const {
  if (!has(key)) return fallback;
  std::string text = get(key, "");
  std::int64_t scale = 1;
  switch (text.empty() ? '\0' : text.back()) {
    case 'K':
    case 'k':
      scale = 1 << 10;
      text.pop_back();
      break;
    case 'M':
    case 'm':
      scale = 1 << 20;
      text.pop_back();
      break;
    case 'G':
    case 'g':
      scale = std::int64_t{1} << 30;
      text.pop_back();
      break;
    default:
      break;
  }
  return static_cast<std::int64_t>(std::stod(text) * static_cast<double>(scale));
}

double slowest_rank(double seconds) {
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

std::vector<std::string> split_list(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, sep);) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

std::string Table::str() const {
  std::vector<std::size_t> width(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  };
  widen(header_);
  for (const auto& r : rows_) widen(r);
  auto line = [&](const std::vector<std::string>& row) {
    std::string out;
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) {
      out += std::string(width[i] - row[i].size(), ' ') + row[i] + (i + 1 < row.size() ? "  " : "");
    }
    return out + "\n";
  };
  std::string out = line(header_);
  for (const auto& r : rows_) out += line(r);
  return out;
}

std::string run_capture(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  const int status = pclose(pipe);
  return status == 0 ? out : std::string();
}

std::string find_python(const std::string& requested) {
  std::vector<std::string> candidates;
  if (!requested.empty()) candidates.push_back(requested);
  if (const char* env = std::getenv("ZRT_PYTHON")) candidates.emplace_back(env);
  candidates.insert(candidates.end(), {"python3", "/usr/bin/python3"});
  for (const auto& python : candidates) {
    if (!run_capture("'" + python + "' -c 'import torch; print(1)' 2>/dev/null").empty()) {
      return python;
    }
  }
  return "";
}

std::string find_script(const std::string& name, const std::string& fallback) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    const std::string path = dir + "/" + name;
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return fallback;
}

std::string human_bytes(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30) && bytes % (std::int64_t{1} << 30) == 0)
    return std::to_string(bytes >> 30) + "G";
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

}  // namespace zrt::bench

int main(int argc, char** argv) {
  using namespace zrt::bench;
  if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const Entry& e : kCommands) {
    if (std::strcmp(argv[1], e.name) == 0) {
      try {
        return e.run(argc - 1, argv + 1);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "zrt-bench %s: %s\n", e.name, ex.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "zrt-bench: unknown subcommand '%s'\n", argv[1]);
  usage();
  return 2;
}
