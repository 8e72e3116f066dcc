// zrt-train's loop end to end on a small corpus written here: every logged step lands in
// metrics.jsonl with the documented fields, evaluation and sampling run, the loss falls, and
// stages 0 and 3 (with offload and activation checkpointing) give the same losses, for GPT-2 and
// for the Llama family (a tiny Llama and a Qwen2 with biases and a tied head). The library
// entry (Trainer with a caller's ModelFactory) trains exactly as the registry path does.
// model.frozen keeps its parameters bit for bit through zrt-train's whole path (the config's
// patterns, ZeRO++'s quantized collectives, fp16's loss scale, offload, Lion).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "kernels/kernel_context.h"
#include "models/model_registry.h"
#include "optimizers/optimizer_config.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/data/token_shard.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/trace/trace_recorder.h"
#include "tests/trace/trace_test_util.h"
#include "train/trainer.h"

using namespace zrt;

namespace {

// One directory per world size: ctest runs the np1 and np2 jobs side by side, and each writes
// its corpus and output directories here.
std::string corpus_dir() {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto dir =
      std::filesystem::temp_directory_path() / ("zrt_test_train_np" + std::to_string(world));
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    // A repetitive text, so a few steps visibly lower the loss.
    std::string text;
    for (int i = 0; i < 400; ++i)
      text += "In the beginning was the Word, and the Word was with God. ";
    std::vector<std::uint16_t> tokens(text.begin(), text.end());
    write_shard((dir / "t_train_000000.bin").string(), tokens.data(), tokens.size());
    write_shard((dir / "t_val_000000.bin").string(), tokens.data(), 4000);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

// A tiny Qwen2-MoE (4 experts, a shared expert, layer 1 dense): a model block's keys.
constexpr const char* kTinyQwen2Moe =
    R"("type": "qwen2_moe", "hidden_size": 32, "intermediate_size": 48,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "vocab_size": 256, "max_position_embeddings": 32, "num_experts": 4,
       "num_experts_per_tok": 2, "moe_intermediate_size": 16,
       "shared_expert_intermediate_size": 24, "mlp_only_layers": [1],
       "router_aux_loss_coef": 0.02)";

// `model`: the model block's keys other than activation_checkpointing ("" : gpt2-tiny).
Config make_config(const std::string& dir, const std::string& name, const std::string& zero,
                   bool checkpointing, int world, const std::string& extra = "",
                   const std::string& model = "") {
  const std::string model_keys =
      model.empty() ? std::string(R"("preset": "gpt2-tiny", "seq_len": 32)") : model;
  const std::string text = R"({
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "zero_optimization": )" +
                           zero + R"(,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "model": {)" + model_keys +
                           R"(, "activation_checkpointing": )" +
                           (checkpointing ? "true" : "false") + R"(},
    "data": {"train": ")" + dir +
                           R"(/t_train_*.bin", "val": ")" + dir +
                           R"(/t_val_*.bin", "shuffle": false},
    "train": {"steps": 6, "log_interval": 1, "eval_interval": 3, "eval_batches": 2,
              "sample_tokens": 8},
    "device": {"type": "cpu"},)" +
                           extra + R"(
    "output_dir": ")" + dir +
                           "/" + name + R"("
  })";
  return parse_config_text(text, world, name + ".json");
}

train::RankInfo this_rank(int world) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return train::RankInfo{rank, world, rank, world};
}

train::RunSummary run(const std::string& dir, const std::string& name, const std::string& zero,
                      bool checkpointing, int world, const std::string& extra = "",
                      const train::TrainHooks& hooks = {}, const std::string& model = "") {
  return train::run_training(make_config(dir, name, zero, checkpointing, world, extra, model),
                             this_rank(world), hooks);
}

}  // namespace

TEST_CASE("zrt-train: metrics, eval, sample; stage 3 with offload equals stage 0") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  const auto s0 = run(dir, "stage0", R"({"stage": 0})", false, world);
  const auto s3 = run(dir, "stage3",
                      R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                          "offload_optimizer": {"device": "cpu"}})",
                      true, world);
  REQUIRE(s0.losses.size() == 6);
  REQUIRE(s3.losses.size() == 6);
  CHECK(s0.losses.front() == Approx(std::log(256.0)).epsilon(0.02));
  CHECK(s0.losses.back() < s0.losses.front() - 0.5);
  for (std::size_t i = 0; i < s0.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(s3.losses[i] == Approx(s0.losses[i]).epsilon(1e-5));
  }
  CHECK(s0.eval_losses.size() == 2);  // after steps 3 and 6
  CHECK(s0.sample.size() == std::string("And God said").size() + 8);
  CHECK(s0.steps == 6);
  CHECK(s0.skipped == 0);
  if (rank == 0) {
    std::ifstream in(dir + "/stage3/metrics.jsonl");
    std::string line;
    int train_rows = 0, eval_rows = 0;
    while (std::getline(in, line)) {
      const auto row = nlohmann::json::parse(line);
      if (row.contains("val_loss")) {
        ++eval_rows;
        continue;
      }
      ++train_rows;
      for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mem_peak_bytes",
                              "comm_bytes", "loss_scale", "skipped"}) {
        INFO(key);
        CHECK(row.contains(key));
      }
      CHECK(row["mem_peak_bytes"].contains("params"));
      CHECK(row["mem_peak_bytes"]["master"] == 0);  // offloaded: never on the device
      CHECK(row["comm_bytes"].get<std::int64_t>() > 0);
      CHECK(row["comm_inter_node_bytes"].get<std::int64_t>() == 0);  // one machine, one node
    }
    CHECK(train_rows == 6);
    CHECK(eval_rows == 2);
  }
}

TEST_CASE("zrt-train trains the Llama family; stage 3 with offload equals stage 0", "[llama]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = corpus_dir();
  const std::pair<const char*, const char*> models[] = {
      {"llama", R"("type": "llama", "preset": "llama-tiny", "seq_len": 32)"},
      {"qwen2", R"("type": "qwen2", "hidden_size": 64, "intermediate_size": 96,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "vocab_size": 256, "max_position_embeddings": 32,
                   "tie_word_embeddings": true)"}};
  for (const auto& [name, model] : models) {
    INFO(name);
    const auto s0 =
        run(dir, std::string(name) + "-stage0", R"({"stage": 0})", false, world, "", {}, model);
    const auto s3 = run(dir, std::string(name) + "-stage3",
                        R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                            "offload_optimizer": {"device": "cpu"}})",
                        true, world, "", {}, model);
    REQUIRE(s0.losses.size() == 6);
    REQUIRE(s3.losses.size() == 6);
    CHECK(s0.losses.front() == Approx(std::log(256.0)).epsilon(0.02));
    CHECK(s0.losses.back() < s0.losses.front() - 0.5);
    for (std::size_t i = 0; i < s0.losses.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(s3.losses[i] == Approx(s0.losses[i]).epsilon(1e-5));
    }
    CHECK(s0.eval_losses.size() == 2);
    CHECK(s0.sample.size() == std::string("And God said").size() + 8);
  }
}

TEST_CASE("zrt-train trains a mixture of experts; metrics rows carry its routing", "[moe]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = corpus_dir();
  // Qwen2-MoE: a shared expert, a dense layer; 2 micro-batches of 2 rows of 32 tokens a rank.
  const std::string model = kTinyQwen2Moe;
  const auto s0 = run(dir, "moe-stage0", R"({"stage": 0})", false, world, "", {}, model);
  const auto s3 = run(dir, "moe-stage3",
                      R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                          "offload_optimizer": {"device": "cpu"}})",
                      true, world, "", {}, model);
  REQUIRE(s0.losses.size() == 6);
  CHECK(s0.losses.back() < s0.losses.front() - 0.5);
  for (std::size_t i = 0; i < s0.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(s3.losses[i] == Approx(s0.losses[i]).epsilon(1e-5));
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::ifstream in(dir + "/moe-stage0/metrics.jsonl");
    std::string line;
    int rows = 0;
    while (std::getline(in, line)) {
      const auto row = nlohmann::json::parse(line);
      if (row.contains("val_loss") || !row.contains("loss")) continue;
      ++rows;
      // The term alone: about k = 2 for a balanced router (E sum_e (k/E)(1/E)), and at least 1.
      CHECK(row["router_aux_loss"].get<double>() >= 1.0);
      CHECK(row["router_aux_loss"].get<double>() < 4.0);
      // One MoE layer (layer 1 is dense): the step's pairs over every rank's forwards are
      // world x 2 micro-batches x 64 tokens x k 2, spread over the 4 experts.
      const std::int64_t pairs = std::int64_t{world} * 2 * 64 * 2;
      const std::int64_t lo = row["expert_tokens_min"], hi = row["expert_tokens_max"];
      CHECK(lo <= pairs / 4);
      CHECK(hi >= pairs / 4);
      CHECK(hi <= pairs);
      CHECK(row["dropped_tokens"] == 0);
    }
    CHECK(rows == 6);
  }
}

namespace {

// A metrics.jsonl's training rows' routing columns, (expert_tokens_min, expert_tokens_max).
std::vector<std::pair<std::int64_t, std::int64_t>> routing_rows(const std::string& path) {
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("val_loss") || !row.contains("loss")) continue;
    rows.emplace_back(row["expert_tokens_min"].get<std::int64_t>(),
                      row["expert_tokens_max"].get<std::int64_t>());
  }
  return rows;
}

}  // namespace

TEST_CASE("zrt-train with expert_parallel.autoep_size = world trains the MoE as every expert local",
          "[moe]") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world < 2) return;  // one rank holds every expert
  const std::string dir = corpus_dir();
  const std::string model = kTinyQwen2Moe;
  const auto local = run(dir, "moe-ep-local", R"({"stage": 2})", false, world, "", {}, model);
  // Each rank holds 4 / world experts; the collective sequence is agreed on first on every group.
  const std::string ep = R"("expert_parallel": {"enabled": true, "autoep_size": )" +
                         std::to_string(world) +
                         R"(}, "comm": {"check_collective_sequence": true},)";
  const auto split = run(dir, "moe-ep-split", R"({"stage": 2})", false, world, ep, {}, model);
  const auto split3 = run(dir, "moe-ep-split3",
                          R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                              "offload_optimizer": {"device": "cpu"}})",
                          true, world, ep, {}, model);
  REQUIRE(split.losses.size() == local.losses.size());
  REQUIRE(split3.losses.size() == local.losses.size());
  for (std::size_t i = 0; i < local.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(split.losses[i] == Approx(local.losses[i]).epsilon(1e-5));
    CHECK(split3.losses[i] == Approx(local.losses[i]).epsilon(1e-5));
  }
  CHECK(split.eval_losses.size() == local.eval_losses.size());
  if (rank == 0) {
    // Each rank counts its own tokens' routing and the rows sum them: the same pairs per expert.
    const auto want = routing_rows(dir + "/moe-ep-local/metrics.jsonl");
    CHECK(want.size() == 6);
    CHECK(routing_rows(dir + "/moe-ep-split/metrics.jsonl") == want);
  }
}

TEST_CASE("comm.ranks_per_node splits the ranks into nodes; metrics count the bytes between them") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  // One rank per node: with 2 ranks every byte rank 0 sends crosses to the other node.
  run(dir, "nodes", R"({"stage": 2})", false, world, R"("comm": {"ranks_per_node": 1},)");
  if (rank != 0) return;
  std::ifstream in(dir + "/nodes/metrics.jsonl");
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("comm_bytes")) continue;
    ++rows;
    const auto inter = row["comm_inter_node_bytes"].get<std::int64_t>();
    if (world == 1) {
      CHECK(inter == 0);
    } else {
      CHECK(inter > 0);
    }
  }
  CHECK(rows == 6);
}

TEST_CASE("zrt-train: trace.path writes one Chrome trace per rank for trace.steps") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  const std::string path = dir + "/traced/timeline.json";
  // One rank per node, so the steps' bytes across nodes are not zero.
  const auto summary = run(
      dir, "traced", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})", false, world,
      R"( "trace": {"path": ")" + path + R"(", "steps": [4, 5]}, "comm": {"ranks_per_node": 1},)");
  REQUIRE(summary.steps == 6);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string mine = trace_path_for_rank(path, rank, world);
  if (world > 1) CHECK(mine == dir + "/traced/timeline.rank" + std::to_string(rank) + ".json");
  const zrt::test::ParsedTrace trace = zrt::test::parse_trace(mine);
  CHECK(trace.pid == rank);
  zrt::test::check_tracks_serial(trace);
  const auto& steps = trace.track("steps");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].name == "step 4");
  CHECK(steps[1].name == "step 5");
  // Each step marker carries the bytes this rank sent in that step, within and across nodes:
  // rank 0's equal its metrics rows for those steps (logged every step), counted apart.
  if (rank == 0) {
    std::map<std::int64_t, nlohmann::json> rows;
    std::ifstream in(dir + "/traced/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto row = nlohmann::json::parse(line);
      if (row.contains("comm_bytes")) rows[row["step"].get<std::int64_t>()] = row;
    }
    for (int i = 0; i < 2; ++i) {
      INFO(steps[static_cast<std::size_t>(i)].name);
      const auto& args = steps[static_cast<std::size_t>(i)].args;
      REQUIRE(rows.count(4 + i) == 1);
      REQUIRE(args.count("comm_bytes") == 1);
      for (const char* key : {"comm_bytes", "comm_intra_node_bytes", "comm_inter_node_bytes"}) {
        INFO(key);
        REQUIRE(args.count(key) == 1);
        CHECK(args.at(key) == rows[4 + i][key].get<std::int64_t>());
      }
      // One rank per node: nothing stays on a node; with two ranks something crosses.
      CHECK(args.at("comm_intra_node_bytes") == 0);
      CHECK((args.at("comm_inter_node_bytes") > 0) == (world > 1));
    }
  }
  // Two micro-batches per step, the GPT's modules each: forward module 1 four times.
  CHECK(trace.named("compute", "forward module 1").size() == 4);
  for (const char* track : {"compute", "comm", "copy", "CPU optimizer"}) {
    INFO(track);
    CHECK_FALSE(trace.track(track).empty());
    for (const auto& e : trace.track(track)) {
      CHECK(e.ts >= steps.front().ts);
      CHECK(e.end() <= steps.back().end());
    }
  }
}

TEST_CASE("a NaN in one rank's gradients skips that step on every rank; training goes on") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  // The last rank's gradients of step 3 become NaN (runtime/common/fault.h); the others' stay
  // finite, so only the global decision can make them skip.
  const int victim = world - 1;
  const std::string fault = "nan:rank=" + std::to_string(victim) + ":step=3";
  setenv("ZRT_FAULT_INJECT", fault.c_str(), 1);
  std::vector<std::vector<float>> params;  // every parameter's fp32 master value after each step
  std::vector<int> skipped;
  train::TrainHooks hooks;
  hooks.after_step = [&](std::int64_t, ZeroEngine& engine, const StepResult&) {
    const StepResult result = engine.settle_step();  // a quiet step's may be undecided
    std::vector<float> all;
    for (int p = 0; p < static_cast<int>(engine.params().size()); ++p) {
      const std::vector<float> v = engine.full_parameter(p);
      all.insert(all.end(), v.begin(), v.end());
    }
    params.push_back(std::move(all));
    skipped.push_back(result.skipped ? 1 : 0);
  };
  const auto s =
      run(dir, "nan", R"({"stage": 2, "reduce_bucket_size": 20000})", false, world, "", hooks);
  unsetenv("ZRT_FAULT_INJECT");
  REQUIRE(params.size() == 6);
  CHECK(skipped == std::vector<int>{0, 0, 1, 0, 0, 0});
  // The same decision on every rank.
  std::vector<int> lowest(skipped.size()), highest(skipped.size());
  MPI_Allreduce(skipped.data(), lowest.data(), 6, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(skipped.data(), highest.data(), 6, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lowest == highest);
  // Step 3 left every parameter exactly as step 2 did; the steps before and after changed them.
  CHECK(params[2] == params[1]);
  CHECK(params[1] != params[0]);
  CHECK(params[3] != params[2]);
  for (float v : params.back()) REQUIRE(std::isfinite(v));
  CHECK(s.skipped == 1);
  CHECK(s.steps == 6);
  for (double loss : s.losses) CHECK(std::isfinite(loss));
  CHECK(s.losses.back() < s.losses.front());
  if (rank == 0) {
    std::ifstream in(dir + "/nan/metrics.jsonl");
    std::string line;
    std::vector<bool> row_skipped;
    std::vector<std::int64_t> row_total;
    while (std::getline(in, line)) {
      const auto row = nlohmann::json::parse(line);
      if (row.contains("val_loss")) continue;
      row_skipped.push_back(row["skipped"].get<bool>());
      row_total.push_back(row["skipped_total"].get<std::int64_t>());
    }
    CHECK(row_skipped == std::vector<bool>{false, false, true, false, false, false});
    CHECK(row_total == std::vector<std::int64_t>{0, 0, 1, 1, 1, 1});
  }

  // The same poisoned step between logged steps (1, 4 and 6), with no hook: its decision stays
  // on the device and the loop learns of it at step 4, after step 4's micro-batches; step 3
  // still gets its row, before step 4's, and every loss is where it was (step 4's moved to the
  // first loss slot when steps 2-3 were read for the late row).
  setenv("ZRT_FAULT_INJECT", fault.c_str(), 1);
  Config quiet =
      make_config(dir, "nan_quiet", R"({"stage": 2, "reduce_bucket_size": 20000})", false, world);
  quiet.train.log_interval = 4;
  if (rank == 0) std::filesystem::remove_all(quiet.output_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto q = train::run_training(quiet, this_rank(world));
  unsetenv("ZRT_FAULT_INJECT");
  CHECK(q.skipped == 1);
  CHECK(q.losses == s.losses);  // bit for bit
  if (rank == 0) {
    std::ifstream in(quiet.output_dir + "/metrics.jsonl");
    std::string line;
    std::vector<std::int64_t> steps;
    std::vector<bool> row_skipped;
    while (std::getline(in, line)) {
      const auto row = nlohmann::json::parse(line);
      if (row.contains("val_loss")) continue;
      steps.push_back(row["step"].get<std::int64_t>());
      row_skipped.push_back(row["skipped"].get<bool>());
      CHECK(row["loss"].get<double>() == s.losses[static_cast<std::size_t>(steps.back() - 1)]);
      if (steps.back() == 3) CHECK(row["grad_norm"].is_null());  // JSON writes NaN as null
    }
    CHECK(steps == std::vector<std::int64_t>{1, 3, 4, 6});
    CHECK(row_skipped == std::vector<bool>{false, true, false, false});
  }
}

// The loop reads the losses from the device only on logged steps (and at a stop), so a quiet
// step waits for the device once, in the step's decision (tests/standin/test_standin_host_waits
// counts the waits). What it reads must be what reading every step gave.
TEST_CASE("losses read on logged steps only: every step's loss, in the summary and the monitors") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  const std::string zero = R"({"stage": 2})";
  const auto every = run(dir, "losses_every", zero, false, world);
  REQUIRE(every.losses.size() == 6);

  // Logged: steps 1, 4 and 6 (the first, every fourth, the last).
  const std::string csv = R"("csv_monitor": {"enabled": true},)";
  Config sparse = make_config(dir, "losses_sparse", zero, false, world, csv);
  sparse.train.log_interval = 4;
  if (rank == 0) std::filesystem::remove_all(sparse.output_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto s = train::run_training(sparse, this_rank(world));
  CHECK(s.losses == every.losses);  // bit for bit: the same sums, divisions and averages
  if (rank == 0) {
    std::vector<std::int64_t> logged;
    std::ifstream metrics(sparse.output_dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) {
      const auto row = nlohmann::json::parse(line);
      if (!row.contains("loss")) continue;
      logged.push_back(row["step"].get<std::int64_t>());
      CHECK(row["loss"].get<double>() == every.losses[static_cast<std::size_t>(logged.back() - 1)]);
    }
    CHECK(logged == std::vector<std::int64_t>{1, 4, 6});
    // The monitor gets every step's loss, each at its own x (samples trained).
    std::ifstream in(sparse.csv_monitor.log_dir() + "/Train_Samples_train_loss.csv");
    std::getline(in, line);
    CHECK(line == "step,train_loss");
    std::vector<std::int64_t> xs;
    while (std::getline(in, line)) {
      const std::size_t comma = line.find(',');
      xs.push_back(std::stoll(line.substr(0, comma)));
      CHECK(std::stod(line.substr(comma + 1)) == Approx(every.losses[xs.size() - 1]).epsilon(1e-5));
    }
    const std::int64_t per_step = sparse.batch.train_batch_size;
    CHECK(xs == std::vector<std::int64_t>{per_step, 2 * per_step, 3 * per_step, 4 * per_step,
                                          5 * per_step, 6 * per_step});
    // And every step's gradient norm, the quiet steps' read from the device a step late: what
    // the run logging every step wrote.
    std::vector<double> every_norms;
    std::ifstream every_metrics(dir + "/losses_every/metrics.jsonl");
    while (std::getline(every_metrics, line)) {
      const auto row = nlohmann::json::parse(line);
      if (row.contains("grad_norm")) every_norms.push_back(row["grad_norm"].get<double>());
    }
    REQUIRE(every_norms.size() == 6);
    std::ifstream norms(sparse.csv_monitor.log_dir() + "/Train_Samples_grad_norm.csv");
    std::getline(norms, line);
    CHECK(line == "step,grad_norm");
    std::size_t n = 0;
    while (std::getline(norms, line)) {
      REQUIRE(n < every_norms.size());
      const double value = std::stod(line.substr(line.find(',') + 1));
      INFO("step " << n + 1);
      CHECK(value == every_norms[n]);  // both written to round trip
      ++n;
    }
    CHECK(n == 6);
  }

  // A stop between logged steps (step 3) still reports the losses of steps 2 and 3.
  Config stopped = make_config(dir, "losses_stopped", zero, false, world);
  stopped.train.log_interval = 4;
  if (rank == 0) std::filesystem::remove_all(stopped.output_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  int polls = 0;
  train::TrainHooks hooks;
  hooks.stop_requested = [&] { return ++polls == 3 && rank == world - 1; };
  const auto st = train::run_training(stopped, this_rank(world), hooks);
  CHECK(st.status == train::RunStatus::kPreempted);
  REQUIRE(st.losses.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(st.losses[i] == every.losses[i]);
}

TEST_CASE("a caller's ModelFactory is trained as zrt-train trains the registry's model") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = corpus_dir();
  const std::string zero = R"({"stage": 3, "stage3_param_persistence_threshold": 100})";
  const Config config = make_config(dir, "factory_registry", zero, false, world);
  const train::RunSummary registry = train::run_training(config, this_rank(world));

  // The same GPT through the library API, as a program of its own would bring a model: only
  // build, the dimensions and a description; the default initializer is the model's own
  // init_parameter, which the registry's GPT initializer also uses without init_from.
  const train::ModelFactory gpt = train::registry_model(config.model);
  train::ModelFactory factory;
  factory.build = gpt.build;
  factory.seq_len = gpt.seq_len;
  factory.vocab_size = gpt.vocab_size;
  factory.description = "the registry's GPT, built by the caller";
  std::int64_t steps_seen = 0;
  train::TrainHooks hooks;
  hooks.after_step = [&](std::int64_t, ZeroEngine&, const StepResult&) { ++steps_seen; };
  const Config custom_config = make_config(dir, "factory_custom", zero, false, world);
  const train::RunSummary custom =
      train::Trainer(custom_config, this_rank(world)).run(factory, hooks);
  CHECK(steps_seen == 6);
  REQUIRE(custom.losses.size() == registry.losses.size());
  for (std::size_t i = 0; i < custom.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(custom.losses[i] == registry.losses[i]);
  }
  CHECK(custom.eval_losses == registry.eval_losses);
  CHECK(custom.sample == registry.sample);

  // A factory that cannot build, or cannot read model.init_from, is refused with the reason.
  train::ModelFactory no_build = factory;
  no_build.build = nullptr;
  CHECK_THROWS_WITH(train::run_training(custom_config, this_rank(world), no_build),
                    Catch::Contains("build is not set"));
  Config with_init_from = custom_config;
  with_init_from.model.init_from = "weights.safetensors";
  CHECK_THROWS_WITH(train::run_training(with_init_from, this_rank(world), factory),
                    Catch::Contains("model.init_from 'weights.safetensors'") &&
                        Catch::Contains("no initializer"));
}

TEST_CASE("comm.check_collective_sequence: a run whose ranks agree trains with the same bits") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = corpus_dir();
  const std::string zero = R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                               "offload_optimizer": {"device": "cpu"}})";
  const auto plain = run(dir, "sequence-off", zero, true, world);
  // Every collective of every group (the engine's, the control group's) is agreed on first; the
  // training itself is untouched.
  const auto checked =
      run(dir, "sequence-on", zero, true, world, R"("comm": {"check_collective_sequence": true},)");
  REQUIRE(checked.losses.size() == plain.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(checked.losses[i] == plain.losses[i]);
  }
  CHECK(checked.eval_losses == plain.eval_losses);
}

// Token shards too: an evaluation reads the validation windows at most once. 3 windows of 32
// tokens read as 2 micro-batches of 2 leave one row of padding, which must not count (the loss
// is then the token-weighted mean, the same as the plain mean over the 3 windows here, where
// every window has 32 targets); more micro-batches than the split holds, or 0, evaluate it once.
// Before, the fourth row wrapped to window 0 and counted it twice. At lr 0 every run evaluates
// the initial weights.
TEST_CASE("an evaluation of token shards counts each validation window once", "[eval]") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world != 1) return;  // one rank's arithmetic; the SFT test covers several ranks
  const std::string dir = corpus_dir();
  const auto val = std::filesystem::path(dir) / "three_windows";
  std::filesystem::create_directories(val);
  std::string text;
  for (int i = 0; i < 4; ++i) text += "Let there be light: and there was light. ";
  std::vector<std::uint16_t> tokens(text.begin(), text.begin() + 3 * 32 + 1);
  write_shard((val / "w_val_000000.bin").string(), tokens.data(), tokens.size());
  auto val_loss = [&](const std::string& name, int micro, int eval_batches) {
    nlohmann::json doc = make_config(dir, name, R"({"stage": 1})", false, 1).document;
    doc["train_micro_batch_size_per_gpu"] = micro;
    doc["gradient_accumulation_steps"] = 1;
    doc["data"]["val"] = (val / "w_val_*.bin").string();
    doc["optimizer"]["params"] = {{"lr", 0.0}, {"weight_decay", 0.0}};
    doc["train"] = {
        {"steps", 1}, {"log_interval", 1}, {"eval_interval", 1}, {"eval_batches", eval_batches}};
    const Config c = parse_config(doc, 1, name + ".json");
    std::filesystem::remove_all(c.output_dir);
    const train::RunSummary s = train::run_training(c, this_rank(1));
    REQUIRE(s.eval_losses.size() == 1);
    return s.eval_losses[0];
  };
  const double whole = val_loss("eval_whole", 3, 1);  // the 3 windows in one micro-batch
  CHECK(std::isfinite(whole));
  // The same per-token losses summed in other groupings: fp32 rounding, ~1e-7 relative.
  for (const auto& [micro, batches] : {std::pair{2, 0}, std::pair{2, 2}, std::pair{1, 5}}) {
    const double got =
        val_loss("eval_" + std::to_string(micro) + "x" + std::to_string(batches), micro, batches);
    INFO("micro-batch " << micro << ", eval_batches " << batches << ": " << got << " vs " << whole);
    CHECK(std::fabs(got - whole) <= 1e-5 * whole);
  }
}

// Every rank opens the data itself: two ranks that see other files (here rank 1 given a shorter
// shard, as a relative path read from another working directory would) are stopped before
// training, each naming what it sees; they used to read other streams silently (or, with
// another kind of shard, hang in a collective until comm.timeout_s).
TEST_CASE("ranks that see different training data are stopped, naming it", "[data]") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world != 2) return;
  const std::string dir = corpus_dir();
  const auto own = std::filesystem::path(dir) / ("rank" + std::to_string(rank));
  std::filesystem::create_directories(own);
  const std::string text = rank == 0 ? std::string(4000, 'a') : std::string(1000, 'b');
  const std::vector<std::uint16_t> tokens(text.begin(), text.end());
  write_shard((own / "d_train_000000.bin").string(), tokens.data(), tokens.size());
  nlohmann::json doc = make_config(dir, "different_data", R"({"stage": 1})", false, 2).document;
  doc["data"]["train"] = (own / "d_train_*.bin").string();
  doc["data"].erase("val");
  doc["train"] = {{"steps", 1}, {"log_interval", 1}};
  const Config c = parse_config(doc, 2, "different_data.json");
  CHECK_THROWS_WITH(
      train::run_training(c, this_rank(2)),
      Catch::Contains("the ranks read different data: rank " + std::to_string(rank) + " sees") &&
          Catch::Contains("every rank must see the same files"));
}

namespace {

// The registry model's initial fp32 values for `config`'s model and seed (what the engine
// initialises from), by parameter name.
std::vector<std::pair<std::string, std::vector<float>>> initial_parameters(const Config& config) {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("init");
  kernels::KernelContext ctx(*device, *stream);
  const auto def = builtin_models().parse_spec(config.model.spec());
  const auto model = def->build(ctx, ModelOptions{});
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (int p = 0; p < static_cast<int>(model->parameters().size()); ++p) {
    const ParamSpec& spec = model->parameters()[static_cast<std::size_t>(p)];
    std::vector<float> values(static_cast<std::size_t>(spec.numel()));
    model->init_parameter(p, config.seed, 0, spec.numel(), values.data());
    out.emplace_back(spec.name, std::move(values));
  }
  return out;
}

}  // namespace

TEST_CASE("model.frozen: its parameters stay as initialised, bit for bit, on every path",
          "[frozen]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = corpus_dir();
  struct FrozenModel {
    const char* label;
    std::string block;
    std::function<bool(const std::string&)> expected;
    int frozen_count;
  };
  const FrozenModel models[] = {
      // A whole unit (the embedding), a whole block, and one kind of parameter in the other.
      {"llama",
       R"("type": "llama", "preset": "llama-tiny", "seq_len": 32,
          "frozen": ["model.embed_tokens.weight", "model.layers.0.*", "q_proj",
                     "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"])",
       [](const std::string& name) {
         return name == "model.embed_tokens.weight" || name.rfind("model.layers.0.", 0) == 0 ||
                name.find(".q_proj.") != std::string::npos ||
                name == "model.layers.1.post_attention_layernorm.weight" ||
                name == "model.norm.weight";
       },
       1 + 9 + 1 + 2},
      // GPT-2's tied head (the embedding, frozen: logits_backward without its weight gradient),
      // every layer's fused attention projection, weight and bias, layer 1's MLP output weight
      // (matmul_dgelu_backward without its weight gradient), layer 1's second LayerNorm's
      // weight and the final one's bias (layernorm_backward with one of its two).
      {"gpt2",
       R"("preset": "gpt2-tiny", "seq_len": 32,
          "frozen": ["transformer.wte.weight", "c_attn", "transformer.h.1.mlp.c_proj.weight",
                     "transformer.h.1.ln_2.weight", "transformer.ln_f.bias"])",
       [](const std::string& name) {
         return name == "transformer.wte.weight" || name.find(".c_attn.") != std::string::npos ||
                name == "transformer.h.1.mlp.c_proj.weight" ||
                name == "transformer.h.1.ln_2.weight" || name == "transformer.ln_f.bias";
       },
       1 + 2 * 2 + 1 + 2}};
  struct Variant {
    const char* name;
    const char* zero;
    const char* extra;
    bool lion = false;
  };
  const Variant variants[] = {{"frozen-stage0", R"({"stage": 0})", ""},
                              {"frozen-stage2-fp16", R"({"stage": 2, "reduce_bucket_size": 20000})",
                               R"("fp16": {"enabled": true, "initial_scale_power": 8},)"},
                              {"frozen-stage3-zeropp",
                               R"({"stage": 3, "stage3_param_persistence_threshold": 100,
           "zero_quantized_weights": true, "zero_quantized_gradients": true})",
                               ""},
                              {"frozen-stage3-offload",
                               R"({"stage": 3, "stage3_param_persistence_threshold": 100,
           "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}})",
                               "", true}};
  for (const FrozenModel& m : models) {
    for (const Variant& v : variants) {
      INFO(m.label << " " << v.name);
      const auto& expected_frozen = m.expected;
      Config config = make_config(dir, std::string(m.label) + "-" + v.name, v.zero, false, world,
                                  v.extra, m.block);
      if (v.lion) {
        config.optimizer = parse_optimizer_config(nlohmann::json::parse(
            R"({"type": "Lion", "params": {"lr": 3e-4, "weight_decay": 0.1}})"));
      }
      const auto initial = initial_parameters(config);
      int frozen_seen = 0, trained_changed = 0, trained = 0;
      std::vector<double> norms;
      train::TrainHooks hooks;
      hooks.after_step = [&](std::int64_t step, ZeroEngine& engine, const StepResult&) {
        norms.push_back(engine.settle_step().grad_norm);
        REQUIRE(engine.params().size() == initial.size());
        for (int p = 0; p < static_cast<int>(engine.params().size()); ++p) {
          const ParamSpec& spec = engine.params()[static_cast<std::size_t>(p)];
          const auto& [name, init] = initial[static_cast<std::size_t>(p)];
          INFO("step " << step << " parameter " << name);
          REQUIRE(spec.name == name);
          CHECK(spec.frozen == expected_frozen(name));
          const std::vector<float> now = engine.full_parameter(p);
          if (spec.frozen) {
            CHECK(now == init);
            frozen_seen += step == 6 ? 1 : 0;
          } else if (step == 6) {
            ++trained;
            trained_changed += now != init ? 1 : 0;
          }
        }
      };
      const auto s = train::run_training(config, this_rank(world), hooks);
      REQUIRE(s.losses.size() == 6);
      CHECK(s.skipped == 0);
      CHECK(s.losses.back() < s.losses.front());  // the rest still learns
      CHECK(frozen_seen == m.frozen_count);
      CHECK(trained > 0);
      CHECK(trained_changed == trained);
      for (double n : norms) CHECK(std::isfinite(n));
    }
  }
}

TEST_CASE("model.frozen / model.trainable patterns that match nothing are refused, all at once",
          "[frozen]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = corpus_dir();
  const std::string llama = R"("type": "llama", "preset": "llama-tiny", "seq_len": 32, )";
  try {
    run(dir, "frozen-typo", R"({"stage": 1})", false, world, "", {},
        llama + R"("frozen": ["model.embed_tokens.weight", "model.layer.0.*", "mpl"])");
    FAIL("a pattern matching nothing trained");
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Catch::Contains("model.frozen[1] 'model.layer.0.*' matches no parameter"));
    CHECK_THAT(what, Catch::Contains("model.frozen[2] 'mpl' matches no parameter"));
    CHECK_THAT(what, !Catch::Contains("model.frozen[0]"));
    // The names' shapes, so the fix is in the message.
    CHECK_THAT(what, Catch::Contains("model.layers.N.mlp.up_proj.weight"));
  }
  try {
    run(dir, "frozen-all", R"({"stage": 1})", false, world, "", {},
        llama + R"("trainable": ["lm_head.weight", "nothing.*"])");
    FAIL("a trainable pattern matching nothing trained");
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Catch::Contains("model.trainable[1] 'nothing.*' matches no parameter"));
    CHECK_THAT(what, !Catch::Contains("model.trainable[0]"));
  }
  try {
    run(dir, "frozen-everything", R"({"stage": 1})", false, world, "", {},
        llama + R"("frozen": ["weight"])");
    FAIL("a model with nothing to train trained");
  } catch (const InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("model.frozen leaves no parameter of"));
  }
}

// A checkpoint saved while every parameter trained holds Adam moments for all of them; a resume
// that freezes some must not step those moments (a zero gradient with a saved moment still moves
// a parameter): they stay as the checkpoint has them, the others go on training.
TEST_CASE("a resume that freezes trained parameters leaves them as the checkpoint has them",
          "[frozen]") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  if (rank == 0) std::filesystem::remove_all(dir + "/frozen-resume");
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string extra = R"("checkpoint": {"save_dir": ")" + dir +
                            R"(/frozen-resume/checkpoints", "save_interval": 3},)";
  const std::string llama = R"("type": "llama", "preset": "llama-tiny", "seq_len": 32)";
  for (const char* optimizer : {"AdamW", "Lion"}) {
    INFO(optimizer);
    if (rank == 0) std::filesystem::remove_all(dir + "/frozen-resume");
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string optimizer_block = std::string(R"({"type": ")") + optimizer +
                                        R"(", "params": {"lr": 0.001, "weight_decay": 0.1}})";
    Config first = make_config(dir, "frozen-resume", R"({"stage": 2})", false, world, extra, llama);
    first.train.steps = 3;
    first.optimizer = parse_optimizer_config(nlohmann::json::parse(optimizer_block));
    std::vector<std::vector<float>> saved;
    train::TrainHooks capture;
    capture.after_step = [&](std::int64_t, ZeroEngine& engine, const StepResult&) {
      saved.clear();
      for (int p = 0; p < static_cast<int>(engine.params().size()); ++p) {
        saved.push_back(engine.full_parameter(p));
      }
    };
    REQUIRE(train::run_training(first, this_rank(world), capture).steps == 3);

    Config second = make_config(dir, "frozen-resume", R"({"stage": 2})", false, world, extra,
                                llama + R"(, "frozen": ["model.layers.0.*", "lm_head.weight"])");
    second.optimizer = first.optimizer;
    int checked_steps = 0, trained_moved = 0;
    train::TrainHooks check;
    check.after_step = [&](std::int64_t step, ZeroEngine& engine, const StepResult&) {
      ++checked_steps;
      for (int p = 0; p < static_cast<int>(engine.params().size()); ++p) {
        const ParamSpec& spec = engine.params()[static_cast<std::size_t>(p)];
        INFO("step " << step << " parameter " << spec.name);
        const std::vector<float> now = engine.full_parameter(p);
        if (spec.frozen) {
          CHECK(now == saved[static_cast<std::size_t>(p)]);
        } else if (step == 6) {
          trained_moved += now != saved[static_cast<std::size_t>(p)] ? 1 : 0;
        }
      }
    };
    const auto s = train::run_training(second, this_rank(world), check);
    CHECK(s.resumed_from == 3);
    CHECK(s.steps == 6);
    CHECK(checked_steps == 3);        // steps 4, 5 and 6, after the resume
    CHECK(trained_moved == 21 - 10);  // all but block 0's nine tensors and the head
  }
}

// A frozen unit holds no optimizer state; its checkpoint holds zeros in its place (the format is
// unchanged), read from the engine's view (the synchronous save: a read-only zero mapping) or
// the offload's copy. A resume that trains those parameters again starts their moments there
// and moves them; the others resume their moments.
TEST_CASE("a checkpoint holds zeros for frozen units' optimizer state; a resume trains them",
          "[frozen]") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  const std::string llama = R"("type": "llama", "preset": "llama-tiny", "seq_len": 32)";
  const std::string frozen = R"(, "frozen": ["model.layers.0.*", "lm_head.weight"])";
  const auto is_frozen = [](const std::string& name) {
    return name.rfind("model.layers.0.", 0) == 0 || name == "lm_head.weight";
  };
  struct Variant {
    const char* label;
    const char* zero;
    bool async;  // checkpoint.async: the engine's asynchronous copy instead of its view
  };
  for (const Variant& v :
       {Variant{"stage2", R"({"stage": 2})", false},
        Variant{"stage2-async", R"({"stage": 2})", true},
        Variant{"stage3-offload", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                                      "offload_optimizer": {"device": "cpu"}})",
                false},
        Variant{"stage3-offload-async", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                                            "offload_optimizer": {"device": "cpu"}})",
                true}}) {
    INFO(v.label);
    const char* zero = v.zero;
    const std::string name = std::string("frozen-zeros-") + v.label;
    if (rank == 0) std::filesystem::remove_all(dir + "/" + name);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string extra = R"("checkpoint": {"save_dir": ")" + dir + "/" + name +
                              R"(/checkpoints", "save_interval": 3)" +
                              (v.async ? R"(, "async": true)" : "") + "},";
    Config first = make_config(dir, name, zero, false, world, extra, llama + frozen);
    first.train.steps = 3;
    std::vector<std::vector<float>> saved;
    int frozen_units = 0;
    train::TrainHooks capture;
    capture.after_step = [&](std::int64_t, ZeroEngine& engine, const StepResult&) {
      saved.clear();
      for (int p = 0; p < static_cast<int>(engine.params().size()); ++p) {
        saved.push_back(engine.full_parameter(p));
      }
      // The frozen parameters' units hold no optimizer state (so the zeros below are written,
      // not stepped moments that stayed zero).
      frozen_units = 0;
      for (int u = 0; u < static_cast<int>(engine.plan().units().size()); ++u) {
        const bool frozen = engine.plan().unit(u).frozen;
        CHECK(engine.placement(u).frozen() == frozen);
        for (int p : engine.plan().unit(u).params) {
          CHECK(is_frozen(engine.params()[static_cast<std::size_t>(p)].name) == frozen);
        }
        frozen_units += frozen ? 1 : 0;
      }
    };
    REQUIRE(train::run_training(first, this_rank(world), capture).steps == 3);
    CHECK(frozen_units >= 1);  // at stage 2 one bucket holds block 0's and the head's
    const std::string checkpoint = dir + "/" + name + "/checkpoints/global_step3";
    const checkpoint::CheckpointIndex index = checkpoint::open_index(checkpoint);
    REQUIRE(index.optimizer_states == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
    int frozen_zero = 0, trained_nonzero = 0, frozen_count = 0;
    for (const std::string& dataset : {std::string("/exp_avg"), std::string("/exp_avg_sq")}) {
      const auto state = checkpoint::read_full_params(checkpoint, index, dataset);
      for (std::size_t p = 0; p < index.params.size(); ++p) {
        const bool all_zero =
            std::all_of(state[p].begin(), state[p].end(), [](float x) { return x == 0.0f; });
        if (is_frozen(index.params[p].name)) {
          ++frozen_count;
          frozen_zero += all_zero ? 1 : 0;
        } else {
          trained_nonzero += all_zero ? 0 : 1;
        }
      }
    }
    CHECK(frozen_count == 2 * 10);  // block 0's nine tensors and the head, two moments each
    CHECK(frozen_zero == frozen_count);
    CHECK(trained_nonzero == 2 * (21 - 10));

    // The index records each parameter's own Adam step count: 0 for the frozen ones, whose
    // state it holds as zeros.
    for (const checkpoint::ParamEntry& e : index.params) {
      INFO(e.name);
      CHECK(e.steps == (is_frozen(e.name) ? 0 : 3));
    }

    // Everything trained from the checkpoint on: every parameter moves. The ones frozen before
    // count their Adam steps from the resume, as PyTorch's per-parameter step does, so their
    // first update is Adam's first: m = (1 - b1) g and v = (1 - b2) g^2 with the bias
    // corrections of step 1 move each element by lr x g / (|g| + eps') = lr for |g| >> eps (and
    // AdamW's decay, lr x 0.1 x |p|, under 1% of lr here). Counted from the run's step 4
    // instead, the corrections 1 - 0.9^4 and 1 - 0.999^4 give 0.58 lr.
    Config second = make_config(dir, name, zero, false, world, extra, llama);
    const double lr = 0.003;  // make_config's, constant
    int moved = 0;
    std::vector<double> first_steps;  // |update| / lr of the once-frozen weights' elements
    train::TrainHooks check;
    check.after_step = [&](std::int64_t step, ZeroEngine& engine, const StepResult&) {
      engine.settle_step();
      const EngineCounters counters = engine.counters();
      for (int p = 0; p < static_cast<int>(engine.params().size()); ++p) {
        const std::string& pname = engine.params()[static_cast<std::size_t>(p)].name;
        INFO("step " << step << " parameter " << pname);
        CHECK(counters.parameter_steps[static_cast<std::size_t>(p)] ==
              (is_frozen(pname) ? step - 3 : step));
        const std::vector<float> now = engine.full_parameter(p);
        const std::vector<float>& before = saved[static_cast<std::size_t>(p)];
        if (step == 4 && is_frozen(pname)) {
          for (std::size_t i = 0; i < now.size(); ++i) {
            first_steps.push_back(std::abs(static_cast<double>(now[i]) - before[i]) / lr);
          }
        }
        if (step == 6) moved += now != before ? 1 : 0;
      }
    };
    const auto s = train::run_training(second, this_rank(world), check);
    CHECK(s.resumed_from == 3);
    CHECK(s.steps == 6);
    CHECK(moved == 21);
    REQUIRE(!first_steps.empty());
    std::nth_element(first_steps.begin(), first_steps.begin() + first_steps.size() / 2,
                     first_steps.end());
    const double median = first_steps[first_steps.size() / 2];
    INFO("median |first update| / lr of the parameters frozen before the resume: " << median);
    CHECK(median > 0.95);
    CHECK(median < 1.01);
    // The next checkpoint carries the counts on (a resume from it goes on from them).
    for (const checkpoint::ParamEntry& e :
         checkpoint::open_index(dir + "/" + name + "/checkpoints/global_step6").params) {
      INFO(e.name);
      CHECK(e.steps == (is_frozen(e.name) ? 3 : 6));
    }
    for (float loss : s.losses) CHECK(std::isfinite(loss));
  }
}

// Under expert parallelism each rank holds its own experts' slices of the fused expert tensors
// (named per expert); patterns match the fused names, so a config freezes the same tensors at
// every autoep_size, and a pattern naming one expert matches nothing (refused, naming the
// fused names). The shared expert and the router are frozen by their components.
TEST_CASE("model.frozen under expert parallelism matches the experts' fused names",
          "[frozen][moe]") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world < 2) return;  // one rank holds every expert
  const std::string dir = corpus_dir();
  const std::string ep =
      R"("expert_parallel": {"enabled": true, "autoep_size": )" + std::to_string(world) + "},";
  const auto expected_frozen = [](const std::string& name) {
    return name.rfind("model.layers.0.mlp.experts.", 0) == 0 ||
           name.find(".shared_expert.") != std::string::npos ||
           name.find(".mlp.gate.") != std::string::npos;
  };
  std::vector<std::vector<float>> first;
  int frozen_here = 0;
  train::TrainHooks hooks;
  hooks.after_step = [&](std::int64_t step, ZeroEngine& engine, const StepResult&) {
    for (int p = 0; p < static_cast<int>(engine.params().size()); ++p) {
      const ParamSpec& spec = engine.params()[static_cast<std::size_t>(p)];
      INFO("rank " << rank << " step " << step << " parameter " << spec.name);
      CHECK(spec.frozen == expected_frozen(spec.name));
      const std::vector<float> now = engine.full_parameter(p);
      if (step == 1) {
        first.push_back(now);
        frozen_here += spec.frozen ? 1 : 0;
      } else if (spec.frozen) {
        CHECK(now == first[static_cast<std::size_t>(p)]);
      }
    }
  };
  const auto s = run(dir, "frozen-moe-ep", R"({"stage": 2})", false, world, ep, hooks,
                     std::string(kTinyQwen2Moe) + R"(,
      "frozen": ["model.layers.0.mlp.experts.*", "shared_expert", "gate"])");
  CHECK(s.steps == 6);
  // Layer 0 routes (layer 1 is dense): every rank holds its router, its shared expert's three
  // projections and its 4 / world experts' two tensors each.
  CHECK(frozen_here == 4 + 2 * (4 / world));
  try {
    run(dir, "frozen-moe-one-expert", R"({"stage": 2})", false, world, ep, {},
        std::string(kTinyQwen2Moe) + R"(, "frozen": ["model.layers.0.mlp.experts.3.*"])");
    FAIL("a pattern naming one expert froze it");
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Catch::Contains("model.frozen[0] 'model.layers.0.mlp.experts.3.*' matches "
                                     "no parameter"));
    CHECK_THAT(what, Catch::Contains("model.layers.N.mlp.experts.gate_up_proj"));
  }
}
