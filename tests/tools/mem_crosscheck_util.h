// What the zrt-mem crosschecks (tracker == estimate in real zrt-train runs: dense, at sequence
// parallelism, at expert parallelism) share: the MPI world, the categories compared byte for
// byte, and the corpus every run trains on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <mpi.h>

#include "runtime/data/token_shard.h"
#include "runtime/device/memory.h"

namespace zrt::test {

inline int crosscheck_world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int crosscheck_world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The categories zrt-mem counts exactly (the workspace is compared where a test says why it can
// be: fp32, where only the attention asks for it).
inline constexpr MemCategory kCrosscheckCategories[] = {
    MemCategory::kParams,    MemCategory::kGrads,       MemCategory::kMaster,
    MemCategory::kOptimizer, MemCategory::kActivations, MemCategory::kComm};

// Rank 0 writes `dir` afresh with `<prefix>_train_000000.bin` (and `<prefix>_val_000000.bin` of
// `val_tokens` when > 0) of repeated text; every rank waits for it.
inline void write_crosscheck_corpus(const std::filesystem::path& dir, const std::string& prefix,
                                    std::size_t val_tokens = 0) {
  if (crosscheck_world_rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::string text;
    for (int i = 0; i < 200; ++i) text += "And God said, Let there be light: and there was light. ";
    std::vector<std::uint16_t> t(text.begin(), text.end());
    write_shard((dir / (prefix + "_train_000000.bin")).string(), t.data(), t.size());
    if (val_tokens > 0) {
      write_shard((dir / (prefix + "_val_000000.bin")).string(), t.data(), val_tokens);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The last row of `<output_dir>/metrics.jsonl` that has the tracker's peaks (mem_peak_bytes);
// empty when none has.
inline std::string last_peak_row(const std::string& output_dir) {
  std::ifstream metrics(output_dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) {
    if (line.find("mem_peak_bytes") != std::string::npos) last = line;
  }
  return last;
}

}  // namespace zrt::test
