// zrt-mem at expert parallelism against zrt-train's own per-category peaks (metrics.jsonl), on the
// CPU backend at the world size mpirun gives (2: autoep_size 2; 4: autoep_size 2 and 4): a tiny
// Qwen3-MoE (8 experts, top 3), Mixtral (4 experts, top 2) and Qwen2-MoE (4 experts, top 2, a
// shared expert) at stages 1, 2 and 3, with and without optimizer offload (at stage 3 also with
// parameter offload), with activation checkpointing (one block's kept set, its local experts'
// rows sized alike), and in fp32, where the whole device peak is exact (workspace included).
// Each rank holds E/ep experts of every MoE layer as units of their own, sliced over the world/ep
// ranks of its expert-data-parallel group (under MiCS those in a shard group), and the dense
// units over the world (or the shard group); the experts' reductions and norm run on the expert
// groups' communicators, each with its own MPI scratch;
// the dispatch keeps its count vectors (comm) and the model its local experts' rows and the
// exchange's staging (activations).
//
// Routing: the rows a rank's experts receive are held at a capacity that starts at
// model.expert_rows_reserve x the balanced share and grows with the routing (models/moe/
// expert_rows.h), settled at every buffer after each training pass, so the tracker's peak is a
// function of the capacity reached. The run's metrics row says it (expert_rows_capacity, the
// most of any rank: the category peaks are each the most of any rank too, and only these
// buffers differ between ranks), and the estimate at that capacity must equal the peaks to the
// byte. The default reserve (1.25) is beaten by the tiny models' routing at some ranks, so the
// growth is exercised; a reserve of 1 (variant below) grows at the first layer of every run,
// and the worst case's reserve never grows.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "runtime/data/token_shard.h"
#include "tests/tools/mem_crosscheck_util.h"
#include "tools/mem/memory_estimate.h"
#include "train/trainer.h"

using namespace zrt;
using namespace zrt::mem;

namespace {

// Model blocks: a Qwen3-MoE with q/k norms, a Mixtral, and a Qwen2-MoE with its shared expert
// and a dense layer (both kinds of block); 256 tokens (the corpus is text).
const char* const kMoeModels[] = {
    R"("type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 256,
       "max_position_embeddings": 32, "num_experts": 8, "num_experts_per_tok": 3,
       "moe_intermediate_size": 12, "router_aux_loss_coef": 0.02)",
    R"("type": "mixtral", "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
       "max_position_embeddings": 32, "num_experts": 4, "num_experts_per_tok": 2,
       "router_aux_loss_coef": 0.02)",
    R"("type": "qwen2_moe", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
       "max_position_embeddings": 32, "num_experts": 4, "num_experts_per_tok": 2,
       "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
       "norm_topk_prob": false, "mlp_only_layers": [1], "router_aux_loss_coef": 0.02)"};

// A run's variant: offload (0 none, 1 the optimizer's, 2 the optimizer's and the parameters',
// stage 3 only), activation checkpointing, bf16 (else fp32).
struct Variant {
  int offload;
  bool checkpointing;
  bool bf16;
};
const Variant kVariants[] = {
    {0, false, true}, {1, false, true}, {0, true, true}, {2, false, true}, {1, true, false}};
// model.expert_rows_reserve per run, in turn: the default, the balanced share alone (growth on
// the first forward), and the dropless worst case reserved up front (never grows).
const double kReserves[] = {1.25, 1.0, 1e9};

// The expert rows' capacity the run in `out` reached (its last metrics row's
// expert_rows_capacity), on every rank: rank 0 reads it; the callers' barrier after each run
// keeps the next run's files apart.
std::int64_t reached_capacity(const std::string& out, int rank) {
  std::int64_t capacity = 0;
  if (rank == 0) {
    const std::string last = test::last_peak_row(out);
    REQUIRE_FALSE(last.empty());
    capacity = nlohmann::json::parse(last)["expert_rows_capacity"].get<std::int64_t>();
  }
  MPI_Bcast(&capacity, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  REQUIRE(capacity > 0);
  return capacity;
}

// Whether `world` has the 2 ranks expert parallelism needs (else a note in the report).
bool has_expert_ranks(int world) {
  if (world >= 2) return true;
  WARN("expert parallelism needs at least 2 ranks; world " << world);
  return false;
}

// A folder under the temporary directory holding the corpus the runs read (ep_train_*.bin).
std::filesystem::path corpus_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  test::write_crosscheck_corpus(dir, "ep");
  return dir;
}

// A two-step run's config (micro-batch 2, accumulation 2, AdamW, the corpus in `dir`):
// `parallel` the top-level parallelism keys, `zero` the zero_optimization object, `model_keys`
// besides the model's blocks and seq_len 32.
std::string run_config(const std::filesystem::path& dir, const std::string& out,
                       const std::string& parallel, const std::string& zero, const char* model,
                       const std::string& model_keys, bool bf16) {
  return R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, )" + parallel +
         R"(, "bf16": {"enabled": )" + (bf16 ? "true" : "false") + R"(},
      "zero_optimization": )" +
         zero + R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
      "model": {)" +
         model + R"(, "seq_len": 32)" + model_keys + R"(},
      "data": {"train": ")" +
         (dir / "ep_train_*.bin").string() + R"("},
      "train": {"steps": 2, "log_interval": 1},
      "device": {"type": "cpu"}, "output_dir": ")" +
         out + R"("})";
}

// Trains the run `text` describes at this world (its output in `out`), then zrt-mem's inputs
// from the same config at the expert rows' capacity the run reached.
Inputs train_then_plan(const std::string& text, const std::string& out, const char* name) {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  const Config config = parse_config_text(text, world, name);
  train::run_training(config, train::RankInfo{rank, world, rank, world});
  Inputs in = inputs_from_config(config);
  in.expert_rows = reached_capacity(out, rank);
  return in;
}

// The run's last metrics row against the estimate at the capacity it reached: every category's
// peak to the byte, and in fp32 the whole device peak (rank 0 checks; `what` names the run).
void check_peaks(const std::string& out, const Estimate& e, bool bf16, const std::string& what) {
  const std::string last = test::last_peak_row(out);
  const auto peaks = nlohmann::json::parse(last)["mem_peak_bytes"];
  const CategoryBytes predicted = e.device_peaks();
  INFO(what << ": " << last);
  for (MemCategory c : test::kCrosscheckCategories) {
    INFO(mem_category_name(c));
    CHECK(at(predicted, c) == peaks[mem_category_name(c)].get<std::int64_t>());
  }
  if (!bf16) CHECK(e.device_total() == peaks["total"].get<std::int64_t>());
}

}  // namespace

TEST_CASE("zrt-mem --ep matches zrt-train's peaks at autoep_size 2 and 4, stages 1-3, offload") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (!has_expert_ranks(world)) return;
  const auto dir = corpus_dir("zrt_test_mem_crosscheck_ep_np" + std::to_string(world));
  const char* const stages[] = {R"({"stage": 1, "reduce_bucket_size": 3000)",
                                R"({"stage": 2, "reduce_bucket_size": 3000)",
                                R"({"stage": 3, "stage3_param_persistence_threshold": 100,
          "stage3_prefetch_bucket_size": 6000, "stage3_max_live_parameters": 12000)"};
  int run = 0;  // a fresh output directory per run: metrics.jsonl appends
  for (int ep = 2; ep <= world; ep *= 2) {
    if (world % ep != 0) continue;
    for (const char* model : kMoeModels) {
      for (const char* stage : stages) {
        for (const Variant& v : kVariants) {
          const auto [offload, checkpointing, bf16] = v;
          if (offload == 2 && std::string(stage).find("\"stage\": 3") == std::string::npos) {
            continue;
          }
          const double reserve = kReserves[run % 3];
          const std::string out = (dir / ("run" + std::to_string(run++))).string();
          const std::string zero =
              std::string(stage) +
              (offload >= 1 ? R"(, "offload_optimizer": {"device": "cpu"})" : "") +
              (offload == 2 ? R"(, "offload_param": {"device": "cpu"})" : "") + "}";
          const std::string text = run_config(
              dir, out,
              R"("expert_parallel": {"enabled": true, "autoep_size": )" + std::to_string(ep) + "}",
              zero, model,
              R"(, "expert_rows_reserve": )" + std::to_string(reserve) +
                  R"(, "activation_checkpointing": )" + (checkpointing ? "true" : "false"),
              bf16);
          const Config config = parse_config_text(text, world, "crosscheck_ep.json");
          train::run_training(config, train::RankInfo{rank, world, rank, world});
          Inputs in = inputs_from_config(config);
          REQUIRE(in.engine.expert_parallel_size == ep);
          REQUIRE(in.expert_rows_reserve == reserve);
          const std::int64_t capacity = reached_capacity(out, rank);
          const Estimate at_reserve = estimate(in, in.setting());
          in.expert_rows = capacity;
          const Estimate e = estimate(in, in.setting());
          if (rank == 0) {
            const std::string last = test::last_peak_row(out);
            const auto row = nlohmann::json::parse(last);
            const auto peaks = row["mem_peak_bytes"];
            const CategoryBytes predicted = e.device_peaks();
            INFO(model << "\n"
                       << in.setting().name() << (checkpointing ? ", checkpointing" : "")
                       << (bf16 ? ", bf16" : ", fp32") << ", ep " << ep << " of " << world << ": "
                       << last << "\nexpert_rows_reserve " << reserve);
            // The capacity reached is the reserve's or grown past it, never below; at the
            // worst case's reserve it cannot grow, so the estimate needs no run's figure.
            CHECK(e.device_total() >= at_reserve.device_total());
            if (reserve > 1e8) CHECK(e.device_total() == at_reserve.device_total());
            // The load the routing reached is the rows of the busiest layer over the balanced
            // share: at least 1 (the group's ranks receive their share on average) and within
            // the worst case's ep x min(k, E/ep) / k.
            const double load = row["expert_rows_load"].get<double>();
            CHECK(load >= 1.0);
            CHECK(load <= ep * 1.0);
            // The experts are their own units, and the dispatch's buffers are counted.
            CHECK(e.expert_padded_params > 0);
            CHECK(e.dispatch_activations > 0);
            CHECK(e.dispatch_comm > 0);
            for (MemCategory c : test::kCrosscheckCategories) {
              INFO(mem_category_name(c));
              CHECK(at(predicted, c) == peaks[mem_category_name(c)].get<std::int64_t>());
            }
            // fp32: the attention is the only kernel asking for workspace (in 16 bits the
            // experts' grouped linear layers convert through it too, for the largest expert's
            // rows, which the routing decides), so the whole device peak is exact.
            if (!bf16) {
              CHECK(at(predicted, MemCategory::kWorkspace) ==
                    peaks["workspace"].get<std::int64_t>());
              CHECK(e.device_total() == peaks["total"].get<std::int64_t>());
            }
          }
          MPI_Barrier(MPI_COMM_WORLD);
        }
      }
    }
  }
}

// Sequence and expert parallelism together at 4 ranks (sp 2, autoep_size 2): each rank's chunk of
// the activations and of the rows its experts receive, the attention's whole-sequence tensors and
// the all-to-alls' buffers, the experts' state over their expert-data-parallel group (world / ep
// ranks, spanning the sp blocks) and the sp group's scratch for the router statistics' sum: the
// peaks to the byte at the capacity the run reached, fp32 at stage 2 (the whole device peak) and
// bf16 at stage 3 with optimizer offload and checkpointing.
TEST_CASE("zrt-mem --sp 2 --ep 2 matches zrt-train's peaks") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (world != 4) {
    WARN("sp 2 with autoep_size 2 runs at 4 ranks; world " << world);
    return;
  }
  const auto dir = corpus_dir("zrt_test_mem_crosscheck_sp_ep_np4");
  int run = 0;
  for (const auto& [bf16, zero, checkpointing] :
       {std::tuple{false, R"({"stage": 2, "reduce_bucket_size": 3000})", false},
        std::tuple{true, R"({"stage": 3, "stage3_param_persistence_threshold": 100,
            "offload_optimizer": {"device": "cpu"}})",
                   true}}) {
    const std::string out = (dir / ("run" + std::to_string(run++))).string();
    const std::string text = run_config(
        dir, out,
        R"("sequence_parallel_size": 2, "expert_parallel": {"enabled": true, "autoep_size": 2})",
        zero, kMoeModels[0],
        std::string(R"(, "activation_checkpointing": )") + (checkpointing ? "true" : "false"),
        bf16);
    const Inputs in = train_then_plan(text, out, "crosscheck_sp_ep.json");
    REQUIRE(in.engine.sequence_parallel_size == 2);
    REQUIRE(in.engine.expert_parallel_size == 2);
    const Estimate e = estimate(in, in.setting());
    if (rank == 0) check_peaks(out, e, bf16, in.setting().name() + (bf16 ? ", bf16" : ", fp32"));
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// The MoE layers in tiles of 20 of a rank's 64 rows (model.tiling.mlp_rows; the Qwen2-MoE's
// dense MLP too) at autoep_size 2: the experts' rows a tile's (the capacity grows from a tile's
// balanced share), one kept set of them whatever the blocks, and the backward's scratch at a
// tile's rows; fp32 at stage 2 without checkpointing (the whole device peak) and bf16 at stage 3
// with optimizer offload and checkpointing.
TEST_CASE("zrt-mem --ep matches zrt-train's peaks with the MoE layers tiled") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (!has_expert_ranks(world)) return;
  const auto dir = corpus_dir("zrt_test_mem_crosscheck_ep_tiled_np" + std::to_string(world));
  int run = 0;
  for (const char* model : {kMoeModels[0], kMoeModels[2]}) {
    for (const auto& [bf16, zero, checkpointing] :
         {std::tuple{false, R"({"stage": 2, "reduce_bucket_size": 3000})", false},
          std::tuple{true, R"({"stage": 3, "stage3_param_persistence_threshold": 100,
              "offload_optimizer": {"device": "cpu"}})",
                     true}}) {
      const std::string out = (dir / ("run" + std::to_string(run++))).string();
      const std::string text = run_config(
          dir, out, R"("expert_parallel": {"enabled": true, "autoep_size": 2})", zero, model,
          std::string(R"(, "tiling": {"mlp_rows": 20}, "activation_checkpointing": )") +
              (checkpointing ? "true" : "false"),
          bf16);
      const Inputs in = train_then_plan(text, out, "crosscheck_ep_tiled.json");
      REQUIRE(in.mlp_tile_rows == 20);
      const Estimate e = estimate(in, in.setting());
      Inputs untiled = in;
      untiled.mlp_tile_rows = -1;
      CHECK(e.activations() < estimate(untiled, in.setting()).activations());
      if (rank == 0) {
        check_peaks(out, e, bf16,
                    std::string(model) + "\n" + in.setting().name() + (bf16 ? ", bf16" : ", fp32"));
        // The load is over a whole tile's balanced share (not the short last tile's): within
        // the worst case's ep x min(k, E/ep) / k = 2.
        const double load =
            nlohmann::json::parse(test::last_peak_row(out))["expert_rows_load"].get<double>();
        CHECK(load >= 1.0);
        CHECK(load <= 2.0);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}

// hpZ with expert parallelism 2 over two simulated nodes: the experts' secondary shards over
// their expert-data-parallel ranks in each node (at 4 ranks one: a whole copy; at 2 ranks, one
// rank a node, the same), the dense units' over each node's ranks: the params category (gathered
// and secondary shards at once) to the byte. At 4 ranks also autoep_size 4: each expert unit
// sliced over one rank, read in place, keeps no secondary shard (the engine refused this layout
// when the in-place units were still given hpZ's secondary gather), the dense units keep theirs.
TEST_CASE("zrt-mem --ep matches zrt-train's peaks under hpZ") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (!has_expert_ranks(world)) return;
  const auto dir = corpus_dir("zrt_test_mem_crosscheck_ep_hpz_np" + std::to_string(world));
  int run = 0;
  std::vector<std::pair<const char*, int>> runs{{kMoeModels[0], 2}, {kMoeModels[2], 2}};
  if (world == 4) runs.emplace_back(kMoeModels[0], 4);
  for (const auto& [model, ep] : runs) {
    const std::string out = (dir / ("run" + std::to_string(run++))).string();
    const int per_node = world / 2;
    const std::string zero = R"({"stage": 3, "stage3_param_persistence_threshold": 100,
        "zero_hpz_partition_size": )" +
                             std::to_string(per_node) + "}";
    const std::string text =
        run_config(dir, out,
                   R"("expert_parallel": {"enabled": true, "autoep_size": )" + std::to_string(ep) +
                       R"(}, "comm": {"ranks_per_node": )" + std::to_string(per_node) + "}",
                   zero, model, "", true);
    const Inputs in = train_then_plan(text, out, "crosscheck_ep_hpz.json");
    const Estimate e = estimate(in, in.setting());
    if (per_node > 1) CHECK(e.secondary_peak > 0);
    if (ep == world) CHECK(e.gathered_in_place);
    if (rank == 0) {
      check_peaks(out, e, true,
                  std::string(model) + "\nhpZ, world " + std::to_string(world) + ", ep " +
                      std::to_string(ep));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// Stage 0 with expert parallelism: every unit whole on each rank (the experts, this rank's share of
// each layer's, too), the experts' gradients all-reduced over their expert-data-parallel group on
// its own communicator (its MPI scratch sized by the experts' units), the dense ones over the
// world: every category to the byte, in fp32 the whole device peak, at autoep_size 2 and 4.
TEST_CASE("zrt-mem --ep matches zrt-train's peaks at stage 0") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (!has_expert_ranks(world)) return;
  const auto dir = corpus_dir("zrt_test_mem_crosscheck_ep_s0_np" + std::to_string(world));
  int run = 0;
  for (int ep = 2; ep <= world; ep *= 2) {
    for (const char* model : {kMoeModels[0], kMoeModels[2]}) {
      for (const bool bf16 : {true, false}) {
        const std::string out = (dir / ("run" + std::to_string(run++))).string();
        const std::string text = run_config(
            dir, out,
            R"("expert_parallel": {"enabled": true, "autoep_size": )" + std::to_string(ep) + "}",
            R"({"stage": 0, "reduce_bucket_size": 3000})", model, "", bf16);
        const Inputs in = train_then_plan(text, out, "crosscheck_ep_s0.json");
        REQUIRE(in.engine.stage == 0);
        const Estimate e = estimate(in, in.setting());
        CHECK(e.expert_shard_params == e.expert_padded_params);
        if (rank == 0) {
          check_peaks(out, e, bf16,
                      std::string(model) + "\nstage 0, ep " + std::to_string(ep) + ", world " +
                          std::to_string(world));
        }
        MPI_Barrier(MPI_COMM_WORLD);
      }
    }
  }
}

// MiCS (shard groups of half the world) with expert parallelism 2: the experts' state sliced over
// their expert-data-parallel ranks in a shard group and averaged again over the copies in the
// others (at 4 ranks, E + D: one rank, a whole copy, two copies; D + E: both ranks of the group,
// one copy; at 2 ranks one of one), the dense units' over the shard group: the model state's
// categories and the comm category (the shard and replica groups' MPI scratch, the experts'
// beside the dense units') to the byte, at stages 1-3, in fp32 with the whole device peak.
TEST_CASE("zrt-mem --ep matches zrt-train's peaks under MiCS") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (!has_expert_ranks(world)) return;
  const auto dir = corpus_dir("zrt_test_mem_crosscheck_ep_mics_np" + std::to_string(world));
  const char* const stages[] = {R"("stage": 1, "reduce_bucket_size": 3000)",
                                R"("stage": 2, "reduce_bucket_size": 3000)",
                                R"("stage": 3, "stage3_param_persistence_threshold": 100)"};
  int run = 0;
  for (const char* model : {kMoeModels[0], kMoeModels[2]}) {
    for (const char* stage : stages) {
      for (const bool data_before_expert : {false, true}) {
        const bool bf16 = run % 2 == 0;
        const std::string out = (dir / ("run" + std::to_string(run++))).string();
        const std::string zero =
            std::string("{") + stage + R"(, "mics_shard_size": )" + std::to_string(world / 2) + "}";
        const std::string text = run_config(
            dir, out,
            std::string(R"("expert_parallel": {"enabled": true, "autoep_size": 2}, )") +
                (data_before_expert ? R"("use_data_before_expert_parallelism": true, )" : "") +
                R"("comm": {"ranks_per_node": )" + std::to_string(world / 2) + "}",
            zero, model, "", bf16);
        const Inputs in = train_then_plan(text, out, "crosscheck_ep_mics.json");
        REQUIRE(in.engine.mics_shard_size == world / 2);
        const Estimate e = estimate(in, in.setting());
        if (rank == 0) {
          check_peaks(out, e, bf16,
                      std::string(model) + "\nMiCS, " + stage +
                          (data_before_expert ? ", D + E" : ", E + D") + ", world " +
                          std::to_string(world));
        }
        MPI_Barrier(MPI_COMM_WORLD);
      }
    }
  }
}

// ZeRO++ (qwZ + qgZ) with expert parallelism 2 over two simulated nodes: the experts' units have
// quantized collectives of their own over the expert-data-parallel group (one rank of it on each
// node at 4 ranks, so hierarchical), whose scratch is sized by the experts' slices, beside the
// dense group's: the comm category to the byte (a model whose experts were gathered or reduced
// through the dense group's collectives, or not quantized at all, would leave it different).
TEST_CASE("zrt-mem --ep matches zrt-train's peaks under ZeRO++ (qwZ + qgZ)") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (!has_expert_ranks(world)) return;
  const auto dir = corpus_dir("zrt_test_mem_crosscheck_ep_zeropp_np" + std::to_string(world));
  int run = 0;
  for (const char* model : {kMoeModels[0], kMoeModels[2]}) {
    for (const bool weights : {false, true}) {
      const std::string out = (dir / ("run" + std::to_string(run++))).string();
      const std::string zero =
          std::string(R"({"stage": 3, "stage3_param_persistence_threshold": 100,
          "zero_quantized_gradients": true, "zero_quantized_weights": )") +
          (weights ? "true" : "false") + "}";
      const std::string text = run_config(
          dir, out,
          R"("expert_parallel": {"enabled": true, "autoep_size": 2}, "comm": {"ranks_per_node": )" +
              std::to_string(world / 2) + "}",
          zero, model, "", true);
      const Inputs in = train_then_plan(text, out, "crosscheck_ep_zeropp.json");
      REQUIRE(in.engine.quantized_gradients);
      const Estimate e = estimate(in, in.setting());
      CHECK(e.quantized_comm > 0);
      if (rank == 0) {
        check_peaks(out, e, true,
                    std::string(model) + (weights ? "\nqwZ + qgZ" : "\nqgZ") + ", world " +
                        std::to_string(world));
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}
