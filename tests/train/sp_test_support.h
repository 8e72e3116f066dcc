// What the sequence-parallel training tests share (test_train_sp, test_train_sp_gpt,
// test_train_sp_hosts): make_sp_golden.py's corpus and packed documents, its weights, a zrt-train
// job through zrt::train::run_training at the test's world size, and the metrics it logged.
//
// Every function that trains or writes the shared data is collective over MPI_COMM_WORLD (rank
// 0 writes, every rank trains); `shared` is a directory every rank sees.
#pragma once

#include <catch2/catch.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "models/init_rng.h"
#include "runtime/data/token_shard.h"
#include "tests/data/sft_test_support.h"
#include "train/trainer.h"

namespace zrt::test::sp {

namespace fs = std::filesystem;

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

constexpr std::uint64_t kSeed = 2101;  // make_sp_golden.py's SEED
constexpr int kT = 32;
constexpr int kSteps = 4;

inline nlohmann::json read_golden(const char* path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// make_sp_golden.py's corpus: half random tokens, half a repeat (+1) of the token 4 before.
inline void write_corpus(const fs::path& dir) {
  std::vector<std::uint16_t> tokens;
  const int n = 64 * kT + 1;
  for (int i = 0; i < n; ++i) {
    if (i % 8 < 4) {
      tokens.push_back(static_cast<std::uint16_t>(counter_hash(kSeed, 3000, i) % 64 + 32));
    } else {
      tokens.push_back(static_cast<std::uint16_t>((tokens[i - 4] + 1) % 256));
    }
  }
  fs::create_directories(dir);
  write_shard((dir / "sp_train_000000.bin").string(), tokens.data(), tokens.size());
}

// 16 packed sequences of 1-5 documents (3-14 tokens: most cross a chunk boundary at sp 2 and 4)
// with their prompts masked out of the loss.
inline void write_sft(const fs::path& dir) {
  SftContent c;
  c.T = kT;
  c.vocab = 256;
  c.pad = 255;
  std::uint32_t state = 11;
  auto next = [&](std::uint32_t n) {
    state = state * 1103515245u + 12345u;
    return (state >> 8) % n;
  };
  for (int s = 0; s < 16; ++s) {
    Sequence q;
    int used = 0;
    const int docs = 1 + static_cast<int>(next(5));
    for (int d = 0; d < docs && used < kT - 2; ++d) {
      const int len = std::min(kT - used, 3 + static_cast<int>(next(12)));
      const int prompt = static_cast<int>(next(static_cast<std::uint32_t>(len)));
      for (int t = 0; t < len; ++t) {
        q.tokens.push_back(next(250));
        q.mask.push_back(t >= prompt ? 1 : 0);
      }
      used += len;
      q.ends.push_back(used);
    }
    for (int t = used; t < kT; ++t) {
      q.tokens.push_back(c.pad);
      q.mask.push_back(0);
    }
    c.sequences.push_back(q);
  }
  fs::create_directories(dir);
  write_bytes((dir / "sft_000000.bin").string(), sft_bytes(c));
}

// The corpus in shared/corpus and the packed documents in shared/sft. Collective.
inline void write_data(const fs::path& shared) {
  if (world_rank() == 0) {
    write_corpus(shared / "corpus");
    write_sft(shared / "sft");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The registry's model with make_sp_golden.py's weights, keyed on the parameter index: the norm
// weights (the 1-D ".weight" tensors: Llama's RMSNorms, GPT-2's LayerNorms) float(1 +
// float(0.1 * normal)), every other tensor float(0.2 * normal).
inline train::ModelFactory golden_weights(const Config& config) {
  train::ModelFactory f = train::registry_model(config.model);
  f.initializer = [](const Model& model, std::uint64_t, const std::string&) -> ParamInitializer {
    return [&model](int index, std::int64_t first, std::int64_t count, float* out) {
      const ParamSpec& p = model.parameters()[static_cast<std::size_t>(index)];
      const std::string suffix = ".weight";
      const bool norm = p.shape.size() == 1 && p.name.size() >= suffix.size() &&
                        p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0;
      fill_counter_normal(kSeed, static_cast<std::uint64_t>(index), first, count, norm ? 0.1 : 0.2,
                          out);
      if (norm) {
        for (std::int64_t i = 0; i < count; ++i) out[i] = out[i] + 1.0f;
      }
    };
  };
  return f;
}

struct Job {
  int sp = 1;
  std::string zero = R"({"stage": 1})";
  int micro = 1;  // micro-batch x accumulation x world / sp = the global batch of 4
  int accumulation = 1;
  bool sft = false;
  bool checkpointing = false;
  int steps = kSteps;
  int seq_len = kT;
  std::string checkpoint;  // the "checkpoint" block, if any
  std::string model_type = "llama";
  std::string preset = "llama-tiny";  // empty: none (the dimensions in model_keys)
  std::string comm;                   // the "comm" block, if any
  std::string model_keys;             // more keys of the "model" block (", \"key\": value, ...")
  std::string top_keys;               // more top-level keys ("\"key\": value," ...)
  // make_sp_golden.py's weights (keyed on the parameter index), or the model's own initializer
  // (the same model at any expert-parallel degree, whose parameter table differs).
  bool golden_weights = true;
};

struct Run {
  std::vector<double> losses;
  std::vector<std::int64_t> loss_tokens;
  std::vector<std::int64_t> sequence_bytes;  // comm_sequence_parallel_bytes per logged step
  std::vector<std::int64_t> sequence_sent;   // comm_sequence_parallel_sent_bytes
  // comm_sequence_parallel_inter_node_bytes: the most any rank sent across nodes
  std::vector<std::int64_t> sequence_inter_node;
  std::int64_t activation_peak = 0;  // the largest mem_peak_bytes.activations
  std::vector<double> grad_norms;    // grad_norm per logged step (before clipping)
  // comm_inter_node_bytes per logged step: every group's bytes across nodes, summed so far
  std::vector<std::int64_t> inter_node_bytes;
  // dropped_tokens per logged step: the pairs a capacity factor dropped, summed over the ranks
  std::vector<std::int64_t> dropped;
};

inline std::string config_text(const fs::path& shared, const std::string& name, const Job& job) {
  const std::string out = (shared / "out" / name).string();
  const std::string data =
      job.sft ? (shared / "sft").string() : (shared / "corpus" / "sp_train_*.bin").string();
  return R"({
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": )" +
         std::to_string(job.micro) + R"(,
    "gradient_accumulation_steps": )" +
         std::to_string(job.accumulation) + R"(,
    "sequence_parallel_size": )" +
         std::to_string(job.sp) + R"(,
    "gradient_clipping": 1.0,
    "zero_optimization": )" +
         job.zero + R"(,
    "optimizer": {"type": "Adam", "params": {"lr": 0.003, "weight_decay": 0.0}},
    "model": {"type": ")" +
         job.model_type + R"(", )" +
         (job.preset.empty() ? std::string() : R"("preset": ")" + job.preset + R"(", )") +
         R"("seq_len": )" + std::to_string(job.seq_len) + R"(, "activation_checkpointing": )" +
         (job.checkpointing ? "true" : "false") + job.model_keys + R"(},
    "data": {"train": ")" +
         data + R"(", "shuffle": false},
    "train": {"steps": )" +
         std::to_string(job.steps) + R"(, "log_interval": 1, "sample_tokens": 0},
    "device": {"type": "cpu"},)" +
         (job.checkpoint.empty() ? std::string() : R"("checkpoint": )" + job.checkpoint + ",") +
         (job.comm.empty() ? std::string() : R"("comm": )" + job.comm + ",") + job.top_keys +
         R"(
    "seed": 1,
    "output_dir": ")" +
         out + R"("
  })";
}

// Trains `job` on every rank and reads rank 0's metrics.jsonl. Collective.
inline Run train_run(const fs::path& shared, const std::string& name, const Job& job) {
  const int world = world_size();
  const Config config = parse_config_text(config_text(shared, name, job), world, name + ".json");
  const int rank = world_rank();
  const train::RankInfo ranks{rank, world, rank, world};
  if (job.golden_weights) {
    train::run_training(config, ranks, golden_weights(config));
  } else {
    train::run_training(config, ranks);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Run r;
  std::ifstream in((shared / "out" / name / "metrics.jsonl").string());
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    r.losses.push_back(row["loss"].get<double>());
    r.loss_tokens.push_back(row["loss_tokens"].get<std::int64_t>());
    if (row.contains("grad_norm")) r.grad_norms.push_back(row["grad_norm"].get<double>());
    if (row.contains("dropped_tokens")) {
      r.dropped.push_back(row["dropped_tokens"].get<std::int64_t>());
    }
    if (row.contains("comm_inter_node_bytes")) {
      r.inter_node_bytes.push_back(row["comm_inter_node_bytes"].get<std::int64_t>());
    }
    if (row.contains("comm_sequence_parallel_bytes")) {
      r.sequence_bytes.push_back(row["comm_sequence_parallel_bytes"].get<std::int64_t>());
      r.sequence_sent.push_back(row["comm_sequence_parallel_sent_bytes"].get<std::int64_t>());
      r.sequence_inter_node.push_back(
          row["comm_sequence_parallel_inter_node_bytes"].get<std::int64_t>());
    }
    r.activation_peak =
        std::max(r.activation_peak, row["mem_peak_bytes"]["activations"].get<std::int64_t>());
  }
  return r;
}

// Steps first+1.. of `want` against `got`, each within `rel` of want's.
inline void check_losses(const std::vector<double>& got, const std::vector<double>& want,
                         double rel, std::size_t first = 0) {
  REQUIRE(!got.empty());
  REQUIRE(got.size() + first <= want.size());
  for (std::size_t s = 0; s < got.size(); ++s) {
    INFO("step " << s + first + 1 << ": " << got[s] << " against " << want[s + first]);
    CHECK(std::abs(got[s] - want[s + first]) <= rel * std::abs(want[s + first]));
  }
}

}  // namespace zrt::test::sp
