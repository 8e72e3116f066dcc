// zrt-train on "device": {"type": "cuda"} through the CUDA stand-ins equals the CPU backend: for
// every ZeRO stage, with and without offload, with sequence and with expert parallelism (a tiny
// Qwen3-MoE at autoep_size = world), the per-step losses written to metrics.jsonl agree
// to a relative 1e-5. The CUDA run exercises the whole host path of the CUDA backend (memory,
// streams and events, kernel launches, cuBLAS(Lt) GEMMs, NCCL collectives at this world size).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/data/token_shard.h"
#include "train/trainer.h"

using namespace zrt;

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string corpus_dir(int world) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("zrt_standin_parity_np" + std::to_string(world));
  if (world_rank() == 0) {
    std::filesystem::create_directories(dir);
    std::string text;
    for (int i = 0; i < 300; ++i) text += "And God said, Let there be light: and there was light. ";
    std::vector<std::uint16_t> tokens(text.begin(), text.end());
    write_shard((dir / "p_train_000000.bin").string(), tokens.data(), tokens.size());
    write_shard((dir / "p_val_000000.bin").string(), tokens.data(), 4000);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

// The "loss" of every training row of <output_dir>/metrics.jsonl (rank 0 writes it).
std::vector<double> metric_losses(const std::string& output_dir) {
  std::vector<double> losses;
  std::ifstream in(output_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("loss")) losses.push_back(row["loss"].get<double>());
  }
  return losses;
}

// comm.timeout_s 120: a device fault on one rank (a twin's check) ends that rank's run with an
// exception while its peers wait in a collective; they give up in 2 minutes, not the default 10
// (the test's whole timeout), so the failure is reported, not killed.
std::vector<double> run(const std::string& dir, const std::string& name, const std::string& zero,
                        int accumulation, const std::string& device, int world,
                        bool host_staged = false, const std::string& model_extra = "",
                        const std::string& model = R"("preset": "gpt2-tiny")") {
  const std::string out = dir + "/" + name + "_" + device;
  const std::string text = R"({
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": )" +
                           std::to_string(accumulation) +
                           R"(,
    "gradient_clipping": 1.0,
    "zero_optimization": )" +
                           zero + R"(,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "model": {)" + model + R"(, "seq_len": 32)" +
                           model_extra + R"(},
    "data": {"train": ")" + dir +
                           R"(/p_train_*.bin", "val": ")" + dir +
                           R"(/p_val_*.bin", "shuffle": false},
    "train": {"steps": 4, "log_interval": 1, "eval_interval": 4, "eval_batches": 1,
              "sample_tokens": 4},
    "device": {"type": ")" +
                           device + R"("},
    "comm": {"timeout_s": 120, "host_staged_collectives": )" +
                           (host_staged ? "true" : "false") + R"(},
    "output_dir": ")" + out +
                           R"("
  })";
  const Config config = parse_config_text(text, world, name + ".json");
  const int rank = world_rank();
  const auto summary = train::run_training(config, train::RankInfo{rank, world, rank, world});
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<double> losses = metric_losses(out);
  // Every rank compares rank 0's file (all ranks see the same directory on one node).
  REQUIRE(losses.size() == summary.losses.size());
  return losses;
}

}  // namespace

TEST_CASE("zrt-train on the CUDA stand-ins gives the CPU backend's losses at every stage") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = corpus_dir(world);
  struct Case {
    std::string name, zero;
    int accumulation;
    bool host_staged = false;   // the CUDA run's collectives over MPI through pinned host memory
    std::string model_extra{};  // more keys of the model block (and blocks after it)
    std::string model = R"("preset": "gpt2-tiny")";  // the model block's first keys
  };
  std::vector<Case> cases = {
      {"stage0", R"({"stage": 0})", 2},
      {"stage1", R"({"stage": 1})", 2},
      {"stage2", R"({"stage": 2})", 2},
      {"stage3", R"({"stage": 3, "stage3_param_persistence_threshold": 100})", 2},
      {"stage1_offload", R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})", 2},
      {"stage2_offload", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})", 2},
      {"stage3_offload", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                             "offload_optimizer": {"device": "cpu"},
                             "offload_param": {"device": "cpu"}})",
       2},
      // Partial offload: the CUDA optimizer steps the forward's first units, the CPU the rest.
      {"stage3_offload_ratio", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                                   "offload_optimizer": {"device": "cpu", "ratio": 0.5}})",
       2},
      // One micro-batch per step: the offloaded units' reduced slices go down from the
      // reduction's bucket (offload_takes_reduced_slices), the bucket freed after the copy.
      {"stage2_offload_g1", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})", 1},
      {"stage3_offload_ratio_g1", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                                      "offload_optimizer": {"device": "cpu", "ratio": 0.5}})",
       1},
      // Ranks sharing a GPU: the collectives over MPI through pinned host memory
      // (staged_process_group.h), with offload, MiCS and ZeRO++'s quantized collectives.
      {"staged_stage3_offload", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                                    "offload_optimizer": {"device": "cpu"}})",
       2, true},
      {"staged_mics", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                          "mics_shard_size": 1})",
       2, true},
      {"staged_qwz_qgz", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                             "zero_quantized_weights": true, "zero_quantized_gradients": true})",
       2, true},
      // Long sequences: the checkpointed block inputs in pinned host memory, copied on the CUDA
      // backend's copy stream (cudaMemcpyAsync and events), and the head in tiles of 24 rows.
      {"stage2_cpu_checkpointing_tiled", R"({"stage": 2})", 2, false,
       R"(, "n_layer": 4, "activation_checkpointing": true, "tiling": {"head_rows": 24}},
          "activation_checkpointing": {"cpu_checkpointing": true)"},
      // Frozen parameters: their weight-gradient GEMMs skipped on cuBLAS (a null dweight), the
      // tied head's too, GPT-2's MLP output (beside cuBLASLt's DGELU), the tiled SwiGLU MLP's;
      // their units never reduced nor stepped.
      {"stage2_frozen", R"({"stage": 2})", 2, false,
       R"(, "frozen": ["transformer.wte.weight", "c_attn", "transformer.h.0.mlp.c_proj.weight"])"},
      {"stage3_offload_frozen_llama_tiled",
       R"({"stage": 3, "stage3_param_persistence_threshold": 100,
           "offload_optimizer": {"device": "cpu"}})",
       2, false, R"(, "frozen": ["model.layers.0.*", "q_proj", "lm_head.weight"],
                    "tiling": {"mlp_rows": 24})",
       R"("type": "llama", "preset": "llama-tiny")"},
      // Frozen lower layers at stage 1: the backward ends at block 2 (no backward below), the
      // full gradients span the trained units, a frozen unit has no gradient buffer at all.
      {"stage1_frozen_lower", R"({"stage": 1})", 2, false,
       R"(, "n_layer": 4, "frozen": ["transformer.wte.weight", "transformer.wpe.weight",
                                     "transformer.h.[01].*", "ln_f"])"},
  };
  // Ulysses sequence parallelism over every rank: the all-to-alls of the exchange on NCCL, the
  // whole sequence's buffers shared with the chunk's, at stage 3 (micro-batch 2).
  if (world > 1) {
    cases.push_back({"stage3_sp", R"({"stage": 3, "stage3_param_persistence_threshold": 100})", 2,
                     false,
                     "}, \"sequence_parallel_size\": " + std::to_string(world) +
                         R"(, "activation_checkpointing": {"cpu_checkpointing": false)"});
  }
  // Expert parallelism over every rank: a tiny Qwen3-MoE whose experts are split over the ranks,
  // the tokens' rows through the NCCL stand-in's all-to-alls, the local experts' rows in
  // ExpertRows' buffers (grown with the routing: reserve 1), the grouped GEMMs on cuBLAS's.
  if (world > 1) {
    cases.push_back(
        {"stage3_ep", R"({"stage": 3, "stage3_param_persistence_threshold": 100})", 2, false,
         R"(, "expert_rows_reserve": 1}, "expert_parallel": {"enabled": true, "autoep_size": )" +
             std::to_string(world),
         R"("type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": 256, "max_position_embeddings": 32, "num_experts": 8,
            "num_experts_per_tok": 3, "moe_intermediate_size": 12, "router_aux_loss_coef": 0.02)"});
    // The same with the routers, the query projections and the experts' down projections frozen:
    // their weight-gradient GEMMs skipped on cuBLAS (the grouped ones per local expert), the
    // experts' gate_up still writing theirs.
    cases.push_back({"stage3_ep_frozen", cases.back().zero, 2, false,
                     R"(, "frozen": ["gate", "q_proj", "down_proj"])" + cases.back().model_extra,
                     cases.back().model});
    // At stage 0, ep 2: every unit whole, the experts' gradients all-reduced over their
    // expert-data-parallel group (2 ranks at np4) and scaled by 1 / ep, the norm summed over the
    // expert-parallel group.
    cases.push_back(
        {"stage0_ep2", R"({"stage": 0})", 2, false,
         R"(, "expert_rows_reserve": 1}, "expert_parallel": {"enabled": true, "autoep_size": 2)",
         cases.back().model});
    // The same with the MoE layers in tiles of 20 rows (model.tiling.mlp_rows): an exchange per
    // tile, each run again in the backward, the local experts' rows a tile's.
    cases.push_back(
        {"stage3_ep_tiled", R"({"stage": 3, "stage3_param_persistence_threshold": 100})", 2, false,
         R"(, "expert_rows_reserve": 1, "tiling": {"mlp_rows": 20}}, "expert_parallel": )"
         R"({"enabled": true, "autoep_size": )" +
             std::to_string(world),
         cases.back().model});
    // A capacity factor under sequence parallelism over every rank: the routing pre-pass's counts
    // gathered over the sp group (int32, in place) on the NCCL stand-in, the MoE layers tiled.
    cases.push_back(
        {"stage3_sp_moe_capacity", R"({"stage": 3, "stage3_param_persistence_threshold": 100})", 2,
         false,
         R"(, "capacity_factor": 0.75, "tiling": {"mlp_rows": 5}}, "sequence_parallel_size": )" +
             std::to_string(world) + R"(, "activation_checkpointing": {"cpu_checkpointing": false)",
         cases.back().model});
    // MiCS with expert parallelism 2, shard groups of 2 (at 4 ranks the experts whole on each
    // rank, their gradients averaged over the replica group of the other shard group), the
    // collectives staged through pinned host memory as on ranks sharing a GPU.
    cases.push_back(
        {"staged_stage3_ep_mics",
         R"({"stage": 3, "stage3_param_persistence_threshold": 100, "mics_shard_size": 2})", 2,
         true,
         R"(, "expert_rows_reserve": 1}, "expert_parallel": {"enabled": true, "autoep_size": 2)",
         cases.back().model});
  }
  for (const auto& [name, zero, accumulation, host_staged, model_extra, model] : cases) {
    SECTION(name) {
      const auto cpu = run(dir, name, zero, accumulation, "cpu", world, false, model_extra, model);
      const auto cuda =
          run(dir, name, zero, accumulation, "cuda", world, host_staged, model_extra, model);
      REQUIRE(cpu.size() == 4);
      REQUIRE(cuda.size() == cpu.size());
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        INFO(name << " step " << i + 1 << ": cpu " << cpu[i] << " cuda " << cuda[i]);
        CHECK(std::isfinite(cuda[i]));
        CHECK(std::abs(cuda[i] - cpu[i]) <= 1e-5 * std::abs(cpu[i]));
      }
    }
  }
}
