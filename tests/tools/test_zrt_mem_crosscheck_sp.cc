// zrt-mem at sequence parallelism against zrt-train's own per-category peaks (metrics.jsonl), on
// the CPU backend at the world size mpirun gives (2: sp 2; 4: sp 2 and 4): each rank's chunk of
// the activations, attention's whole-sequence tensors and the all-to-alls' buffers, the token
// batches with the chunk's positions, the CPU attention's kernel workspace (exact in fp32, where
// it is the only kernel asking for one) and zrt-train's own buffers, so the whole device peak;
// a mixture of experts with its MoE layers whole and in tiles.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
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

TEST_CASE("zrt-mem --sp matches zrt-train's peaks at sequence_parallel_size 2 and 4") {
  const int world = test::crosscheck_world_size();
  const int rank = test::crosscheck_world_rank();
  if (world < 2) {
    WARN("sequence parallelism needs at least 2 ranks; world " << world);
    return;
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("zrt_test_mem_crosscheck_sp_np" + std::to_string(world));
  test::write_crosscheck_corpus(dir, "sp");
  // Four blocks, so cpu_checkpointing sends two block inputs to host memory; llama-tiny's and
  // qwen3-moe-tiny's two key/value heads are shared out at sp 4. fp32: the CPU attention is the
  // only kernel asking for workspace, so the workspace category is exact too; bf16 adds the linear
  // layers' conversions, which zrt-mem does not count.
  const char* const models[] = {
      R"("preset": "gpt2-tiny", "n_layer": 4)",
      R"("type": "llama", "preset": "llama-tiny", "num_hidden_layers": 4)",
      R"("type": "qwen3_moe", "preset": "qwen3-moe-tiny", "num_hidden_layers": 4,
         "vocab_size": 256)",
      // The same with its MoE layers in tiles of 6 of a rank's rows (2 x 16 at sp 2, 2 x 8 at
      // sp 4), the short last tile included.
      R"("type": "qwen3_moe", "preset": "qwen3-moe-tiny", "num_hidden_layers": 4,
         "vocab_size": 256, "tiling": {"mlp_rows": 6})",
      // And with a capacity factor: the dispatched pairs (routed) beside the router's, and every
      // rank's routing counts (sp, B, E) the pre-pass gathers over the sp group.
      R"("type": "qwen3_moe", "preset": "qwen3-moe-tiny", "num_hidden_layers": 4,
         "vocab_size": 256, "tiling": {"mlp_rows": 6}, "capacity_factor": 0.75)"};
  int run = 0;  // a fresh output directory per run: metrics.jsonl appends
  for (int sp = 2; sp <= world; sp *= 2) {
    if (world % sp != 0) continue;
    for (const char* model : models) {
      // fp32 at stage 1, bf16 at stage 3 with optimizer offload.
      for (const auto& [bf16, zero] :
           {std::pair{false, R"({"stage": 1, "reduce_bucket_size": 30000})"},
            std::pair{true, R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                  "offload_optimizer": {"device": "cpu"}})"}}) {
        const std::string out = (dir / ("run" + std::to_string(run++))).string();
        const std::string text =
            std::string(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "sequence_parallel_size": )") +
            std::to_string(sp) + R"(, "bf16": {"enabled": )" + (bf16 ? "true" : "false") +
            R"(}, "zero_optimization": )" + zero + R"(,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
              "model": {)" +
            model +
            R"(, "seq_len": 32, "activation_checkpointing": true},
              "activation_checkpointing": {"cpu_checkpointing": true},
              "data": {"train": ")" +
            (dir / "sp_train_*.bin").string() + R"("},
              "train": {"steps": 2, "log_interval": 1},
              "device": {"type": "cpu"}, "output_dir": ")" +
            out + R"("})";
        const Config config = parse_config_text(text, world, "crosscheck_sp.json");
        train::run_training(config, train::RankInfo{rank, world, rank, world});
        const Inputs in = inputs_from_config(config);
        REQUIRE(in.engine.sequence_parallel_size == sp);
        const Estimate e = estimate(in, in.setting());
        if (rank == 0) {
          const std::string last = test::last_peak_row(out);
          REQUIRE_FALSE(last.empty());
          const auto peaks = nlohmann::json::parse(last)["mem_peak_bytes"];
          const CategoryBytes predicted = e.device_peaks();
          INFO(model << (bf16 ? ", bf16, " : ", fp32, ") << in.setting().name() << ", sp " << sp
                     << " of " << world << ": " << last);
          for (MemCategory c : test::kCrosscheckCategories) {
            INFO(mem_category_name(c));
            CHECK(at(predicted, c) == peaks[mem_category_name(c)].get<std::int64_t>());
          }
          if (!bf16) {
            CHECK(at(predicted, MemCategory::kWorkspace) == peaks["workspace"].get<std::int64_t>());
            CHECK(e.device_total() == peaks["total"].get<std::int64_t>());
          }
        }
        MPI_Barrier(MPI_COMM_WORLD);
      }
    }
  }
}
