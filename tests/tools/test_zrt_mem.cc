// zrt-mem's estimate without running the engine: the ZeRO paper's figures, the padded
// per-stage formulas on a real GPT partition, the verdict's order, the config path, and the
// command line's output and errors. (test_zrt_mem_crosscheck compares the estimate with the
// MemoryTracker in real runs; test_model_registry checks the activation hook against the
// model's own layout.)
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "config/config.h"
#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "models/model_registry.h"
#include "runtime/device/device.h"
#include "runtime/engine/partition.h"
#include "tools/mem/longest_sequence.h"
#include "tools/mem/mem_report.h"
#include "tools/mem/memory_estimate.h"

using namespace zrt;
using namespace zrt::mem;

namespace {

std::string run_tool(const std::string& args, int* status = nullptr) {
  const std::string cmd = std::string(ZRT_MEM_TOOL) + " " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const int rc = pclose(pipe.release());
  if (status != nullptr) *status = WEXITSTATUS(rc);
  return out;
}

Inputs paper_inputs() {
  // The ZeRO paper's Figure 1 / Table 1 setting: Ψ = 7.5B, N = 64, mixed-precision Adam
  // (K = 12): fp16 parameters and gradients, fp32 master weights and two moments.
  Inputs in;
  in.params = 7.5e9;
  in.world = 64;
  in.engine.compute_dtype = DType::kFloat16;
  in.engine.grad_accum_dtype = DType::kFloat16;
  return in;
}

// One row of zrt-mem's per-rank report, as mem_report.cc prints it.
std::string report_row(const std::string& name, const std::string& gb, const std::string& note) {
  std::string row = "  " + name;
  row.resize(2 + 34, ' ');
  row += " " + std::string(9 - gb.size(), ' ') + gb + " GB  " + note;
  return row + "\n";
}

}  // namespace

TEST_CASE("the ZeRO paper's Ψ = 7.5B, N = 64 figures: 120 / 31.4 / 16.6 / 1.9 GB") {
  const Inputs in = paper_inputs();
  const std::int64_t expected[] = {120'000'000'000, 31'406'250'000, 16'640'625'000, 1'875'000'000};
  const char* printed[] = {"120.0", "31.4", "16.6", "1.9"};
  for (int stage = 0; stage <= 3; ++stage) {
    const Estimate e = estimate(in, Setting{stage, false, false});
    INFO("stage " << stage);
    CHECK(e.model_state() == expected[stage]);
    CHECK(gb(e.model_state()) == printed[stage]);
    CHECK_FALSE(e.exact);
  }
  // K = 12 split as the paper does: 4Ψ/N master weights, 8Ψ/N moments.
  const Estimate s1 = estimate(in, Setting{1, false, false});
  CHECK(s1.master == 468'750'000);
  CHECK(s1.optimizer == 937'500'000);
}

TEST_CASE("fp32 gradient accumulation adds 2Ψ at stages 0-1 and 2Ψ/N at stages 2-3") {
  Inputs half = paper_inputs();
  Inputs full = paper_inputs();
  full.engine.grad_accum_dtype = DType::kFloat32;
  for (int stage = 0; stage <= 3; ++stage) {
    const std::int64_t extra = stage <= 1 ? 15'000'000'000 : 234'375'000;
    CHECK(estimate(full, {stage, false, false}).model_state() -
              estimate(half, {stage, false, false}).model_state() ==
          extra);
  }
}

TEST_CASE("offload moves master, moments and gradient slices to the host of each node") {
  Inputs in = paper_inputs();
  in.nodes = 8;  // 8 ranks per node
  const Estimate e = estimate(in, Setting{3, true, true});
  CHECK(e.master == 0);
  CHECK(e.optimizer == 0);
  CHECK(e.grads == 0);
  CHECK(e.params == 0);
  CHECK(at(e.host_per_rank, MemCategory::kMaster) == 468'750'000);
  CHECK(at(e.host_per_rank, MemCategory::kOptimizer) == 937'500'000);
  CHECK(at(e.host_per_rank, MemCategory::kGrads) == 234'375'000);
  CHECK(at(e.host_per_rank, MemCategory::kParams) == 234'375'000);
  CHECK(e.ranks_per_node == 8);
  CHECK(e.host_node_total() == 8 * e.host_rank_total());
  // Stage 2 + optimizer offload keeps full parameters on the device, and with gradient
  // accumulation the gradient slices; at one micro-batch per step the reduced slices go to the
  // host as they are (offload_takes_reduced_slices), in the compute dtype.
  in.engine.gradient_accumulation_steps = 4;
  const Estimate s2 = estimate(in, Setting{2, true, false});
  CHECK(s2.model_state() == 15'000'000'000 + 234'375'000);
  CHECK(at(s2.host_per_rank, MemCategory::kGrads) == 234'375'000);
  in.engine.gradient_accumulation_steps = 1;
  in.engine.grad_accum_dtype = DType::kFloat32;
  const Estimate s2_direct = estimate(in, Setting{2, true, false});
  CHECK(s2_direct.model_state() == 15'000'000'000);
  CHECK(at(s2_direct.host_per_rank, MemCategory::kGrads) == 234'375'000);  // fp16, not fp32
  // A reduction in another dtype than the compute dtype is accumulated on the device first.
  in.engine.communication_dtype = DType::kFloat32;
  const Estimate s2_fp32_wire = estimate(in, Setting{2, true, false});
  CHECK(s2_fp32_wire.model_state() == 15'000'000'000 + 2 * 234'375'000);
  CHECK(at(s2_fp32_wire.host_per_rank, MemCategory::kGrads) == 2 * 234'375'000);
}

TEST_CASE("partial offload (ratio) splits the fp32 state; only stage 3's row has it") {
  Inputs in = paper_inputs();  // Ψ = 7.5B over N = 64: 117'187'500 elements a rank
  in.engine.offload_optimizer.ratio = 0.25;
  const Estimate e = estimate(in, Setting{3, true, false});
  // The formula path has no units to round to: the share itself.
  const std::int64_t host = 29'296'875;  // 0.25 x 117'187'500
  CHECK(at(e.host_per_rank, MemCategory::kMaster) == 4 * host);
  CHECK(at(e.host_per_rank, MemCategory::kOptimizer) == 8 * host);
  CHECK(at(e.host_per_rank, MemCategory::kGrads) == 2 * host);
  CHECK(e.master == 4 * (117'187'500 - host));
  CHECK(e.optimizer == 8 * (117'187'500 - host));
  // One micro-batch per step: only the units the device steps keep a gradient slice there.
  CHECK(e.grads == 2 * (117'187'500 - host));
  CHECK(in.name(Setting{3, true, false}) == "stage 3 + optimizer offload (ratio 0.25)");
  // DeepSpeed has partial offload at stage 3 only: the other offload rows are full offload.
  const Estimate s2 = estimate(in, Setting{2, true, false});
  CHECK(s2.master == 0);
  CHECK(in.name(Setting{2, true, false}) == "stage 2 + optimizer offload");
  CHECK(estimate(in, Setting{3, true, true}).master == 0);
}

TEST_CASE("with a model: the per-stage formulas in the padded size P, exactly") {
  const ModelSpec model = model_spec(builtin_models().parse_spec("gpt2"));
  Inputs in;
  in.model = model;
  in.world = 4;
  in.seq_len = 1024;
  in.engine.compute_dtype = DType::kBFloat16;
  in.engine.grad_accum_dtype = DType::kBFloat16;
  in.engine.stage3_param_persistence_threshold = 0;
  const std::int64_t psi = builtin_models().parse_spec("gpt2")->num_parameters();
  for (int stage = 0; stage <= 3; ++stage) {
    const Estimate e = estimate(in, Setting{stage, false, false});
    // P from the engine's partition, built here independently of the estimate.
    const PartitionPlan plan(
        model.params, PartitionOptions{stage, stage == 0 ? 1 : 4, in.engine.reduce_bucket_size, 0,
                                       64, model.num_modules});
    const std::int64_t P = plan.total_numel();
    const std::int64_t n = stage == 0 ? 1 : 4;
    const std::int64_t expected[] = {16 * P, 4 * P + 12 * P / n, 2 * P + 14 * P / n, 16 * P / n};
    INFO("stage " << stage << " P " << P << " Ψ " << psi);
    CHECK(e.exact);
    CHECK(e.content_params == psi);
    CHECK(e.padded_params == P);
    CHECK(e.model_state() == expected[stage]);
    CHECK(P - psi < psi / 1000);  // padding is small for GPT-2
    // Transient buffers: buckets at stages 2-3, gathered units at stage 3 only.
    CHECK((e.buckets_peak > 0) == (stage >= 2));
    CHECK((e.gathered_peak > 0) == (stage == 3));
    CHECK(e.transient_peak >= std::max(e.buckets_peak, e.gathered_peak));
    CHECK(e.transient_peak <= e.buckets_peak + e.gathered_peak);
  }
}

TEST_CASE("mics_shard_size: the model state of N ranks sharded over groups of S is that of S") {
  const ModelSpec model = model_spec(builtin_models().parse_spec("gpt2"));
  Inputs in;
  in.model = model;
  in.world = 8;
  in.seq_len = 1024;
  in.engine.compute_dtype = DType::kBFloat16;
  in.engine.stage3_param_persistence_threshold = 0;
  for (int stage = 1; stage <= 3; ++stage) {
    Inputs grouped = in;
    grouped.engine.mics_shard_size = 2;
    Inputs two = in;
    two.world = 2;
    INFO("stage " << stage);
    const Estimate mics = estimate(grouped, Setting{stage, false, false});
    CHECK(mics.model_state() == estimate(two, Setting{stage, false, false}).model_state());
    CHECK(mics.model_state() > estimate(in, Setting{stage, false, false}).model_state());
  }
}

// Three modules of one weight each (1024, 2048, 512 elements: padded already, to 4 x 64) on a
// CUDA device, bf16, no prefetch, no persistent unit; the world is the caller's.
namespace {
Inputs three_units_bf16() {
  ModelSpec table;
  table.params = {{"a", {1024}, {0}, false}, {"b", {2048}, {1}, false}, {"c", {512}, {2}, false}};
  table.num_modules = 3;
  table.description = "three units";
  Inputs in;
  in.model = table;
  in.device_type = DeviceType::kCuda;
  in.engine.compute_dtype = DType::kBFloat16;
  in.engine.stage3_param_persistence_threshold = 0;
  in.engine.stage3_prefetch_bucket_size = 0;
  return in;
}
}  // namespace

TEST_CASE("hpZ: the secondary shards' memory, replayed from the schedule, as worked by hand") {
  // Three modules of one weight each, at stage 3 over 4 ranks on 2 nodes; hpZ groups of 2.
  Inputs in = three_units_bf16();
  in.world = 4;
  in.nodes = 2;
  const Estimate plain = estimate(in, Setting{3, false, false});
  in.engine.hpz_partition_size = 2;
  const Estimate hpz = estimate(in, Setting{3, false, false});
  // Forward: each unit gathered (1024, 2048, 512) and released after its module, the last one
  // kept for its backward; each keeps a secondary shard of half its size, so after the forward
  // 512 + 1024 + 256 = 1792 elements of secondary shards are alive (their peak).
  CHECK(hpz.secondary_peak == 1792 * 2);
  // Backward of module 1: its unit is gathered from the secondary shards (2048) while b's
  // shard (1024), a's (512) and c's gradient bucket (512) are alive: 4096 elements, of which
  // gathered + secondary 3584 (their peak); then b's shard is freed (-1024) and b's bucket
  // opened (+2048) beside c's, which overlap_comm (the default) keeps while it is reduced
  // (two rotating buckets): 2048 + 512 + 512 + 2048 = 5120, the transient peak.
  CHECK(hpz.params_buffers_peak == 3584 * 2);
  CHECK(hpz.transient_peak == 5120 * 2);
  // The gathered units alone peak at 2048 either way; without hpZ the transient peak is b's
  // gathered unit and its bucket beside c's, 2048 + 2048 + 512.
  CHECK(hpz.gathered_peak == 2048 * 2);
  CHECK(plain.gathered_peak == 2048 * 2);
  CHECK(plain.secondary_peak == 0);
  CHECK(plain.params_buffers_peak == 2048 * 2);
  CHECK(plain.transient_peak == 4608 * 2);
  // The params category: the steady slices (3584 / 4 elements) and the buffers' peak.
  CHECK(at(hpz.device_peaks(), MemCategory::kParams) == (896 + 3584) * 2);
  CHECK(hpz.device_total() - plain.device_total() == (5120 - 4608) * 2);
  // Below stage 3 hpZ does nothing.
  CHECK(estimate(in, Setting{2, false, false}).secondary_peak == 0);
  // The report shows the row; a group that would leave the node is refused.
  const std::string report = format_report(in, hpz, {hpz});
  CHECK(report.find("buffers: hpZ secondary shards") != std::string::npos);
  CHECK(report.find("1/2 of each gathered unit") != std::string::npos);
  Inputs wide = in;
  wide.nodes = 4;
  CHECK_THROWS_WITH(estimate(wide, Setting{3, false, false}),
                    Catch::Contains("--hpz 2 (zero_hpz_partition_size) must divide the ranks per "
                                    "node (1 of 4 ranks on 4 node(s))"));
}

TEST_CASE("one rank at stage 3: gathered bf16 parameters beside full fp32 gradients, in bytes") {
  // The three units above at one rank, bf16 compute, fp32 accumulation. Without qwZ the model
  // reads every slice in place: nothing gathered, no bucket (one rank accumulates full
  // gradients), no transient buffer at all. With qwZ each unit is still gathered (dequantized,
  // bf16) while the gradients accumulate in full: the transient peak is b's 2048 gathered
  // elements at 2 bytes, not at the accumulation dtype's 4.
  Inputs in = three_units_bf16();
  in.world = 1;
  in.engine.grad_accum_dtype = DType::kFloat32;
  const Estimate in_place = estimate(in, Setting{3, false, false});
  CHECK(in_place.gathered_in_place);
  CHECK(in_place.gathered_peak == 0);
  CHECK(in_place.buckets_peak == 0);
  CHECK(in_place.transient_peak == 0);
  in.engine.quantized_weights = true;
  const Estimate qwz = estimate(in, Setting{3, false, false});
  CHECK_FALSE(qwz.gathered_in_place);
  CHECK(qwz.gathered_peak == 2048 * 2);
  CHECK(qwz.buckets_peak == 0);
  CHECK(qwz.transient_peak == 2048 * 2);
}

TEST_CASE("zrt-mem --hpz prints the secondary shards' row") {
  int status = -1;
  const std::string out = run_tool("--model gpt2 --world 16 --nodes 2 --stage 3 --hpz 8", &status);
  CHECK(status == 0);
  CHECK(out.find("buffers: hpZ secondary shards") != std::string::npos);
  const std::string bad = run_tool("--model gpt2 --world 16 --nodes 4 --stage 3 --hpz 8", &status);
  CHECK(status != 0);
  CHECK(bad.find("must divide the ranks per node (4 of 16 ranks on 4 node(s))") !=
        std::string::npos);
}

TEST_CASE("the verdict takes the first setting that fits, in the issue's order") {
  const auto& order = verdict_order();
  REQUIRE(order.size() == 7);
  CHECK(order[0] == Setting{0, false, false});
  CHECK(order[1] == Setting{1, false, false});
  CHECK(order[2] == Setting{2, false, false});
  CHECK(order[3] == Setting{2, true, false});
  CHECK(order[4] == Setting{3, false, false});
  CHECK(order[5] == Setting{3, true, false});
  CHECK(order[6] == Setting{3, true, true});
  // Synthetic device totals (bytes) where stage 3 needs less than stage 2 + optimizer offload:
  // the order, not the smallest total, decides.
  const std::vector<std::pair<Setting, std::int64_t>> totals{
      {{0, false, false}, 100}, {{1, false, false}, 90}, {{1, true, false}, 85},
      {{2, false, false}, 80},  {{2, true, false}, 70},  {{3, false, false}, 60},
      {{3, true, false}, 50},   {{3, true, true}, 40}};
  std::vector<Estimate> all;
  for (const auto& [setting, total] : totals) {
    Estimate e;
    e.setting = setting;
    e.params = total;
    e.workspace = 0;
    REQUIRE(e.device_total() == total);
    all.push_back(e);
  }
  auto fit = [&](std::int64_t cap) { return first_fit(all, cap); };
  CHECK(*fit(100) == Setting{0, false, false});
  CHECK(*fit(99) == Setting{1, false, false});
  CHECK(*fit(85) == Setting{2, false, false});  // stage 1 + offload is not in the verdict's order
  CHECK(*fit(79) == Setting{2, true, false});
  CHECK(*fit(70) == Setting{2, true, false});  // before stage 3, which needs only 60
  CHECK(*fit(69) == Setting{3, false, false});
  CHECK(*fit(55) == Setting{3, true, false});
  CHECK(*fit(40) == Setting{3, true, true});
  CHECK_FALSE(fit(39));
}

TEST_CASE("on a real model more sharding or offload needs less device memory") {
  Inputs in;
  in.model = model_spec(builtin_models().parse_spec("gpt2-xl"));
  in.world = 8;
  in.seq_len = 1024;
  in.activation_checkpointing = true;
  in.engine.compute_dtype = DType::kBFloat16;
  std::vector<Estimate> all;
  for (const Setting& s : table_order()) all.push_back(estimate(in, s));
  auto total = [&](const Setting& s) {
    for (const Estimate& e : all)
      if (e.setting == s) return e.device_total();
    return std::int64_t{-1};
  };
  CHECK(total({0, false, false}) > total({1, false, false}));
  CHECK(total({1, false, false}) > total({1, true, false}));
  CHECK(total({1, false, false}) > total({2, false, false}));
  CHECK(total({2, false, false}) > total({2, true, false}));
  CHECK(total({3, false, false}) > total({3, true, false}));
  CHECK(total({3, true, false}) > total({3, true, true}));
}

TEST_CASE("the verdict names the checkpointing alternative when nothing fits without it") {
  Inputs in;
  in.model = model_spec(builtin_models().parse_spec("gpt2-xl"));
  in.world = 8;
  in.seq_len = 1024;
  in.micro_batch = 32;  // no stage fits without checkpointing; with it stage 0 needs ~41 GB
  in.device_gib = 80;
  in.engine.compute_dtype = DType::kBFloat16;
  std::vector<Estimate> all;
  for (const Setting& s : table_order()) all.push_back(estimate(in, s));
  const std::string line = format_verdict(in, all);
  CHECK_THAT(line, Catch::StartsWith("verdict: no setting fits a 80 GiB (85.9 GB) device; with "
                                     "activation checkpointing stage "));
}

TEST_CASE(
    "the verdict names the smallest offload ratio that fits between stage 3 and full offload") {
  Inputs in;
  in.model = model_spec(builtin_models().parse_spec("gpt2-xl"));
  in.seq_len = 1024;
  in.micro_batch = 1;
  in.activation_checkpointing = true;
  in.engine.compute_dtype = DType::kBFloat16;
  in.device_gib = 20;  // stage 3 at one rank (~25 GB of model state) does not fit; offload does
  const std::int64_t capacity = std::llround(20 * 1073741824.0);
  REQUIRE(estimate(in, Setting{3, false, false}).device_total() > capacity);
  REQUIRE(estimate(in, Setting{3, true, false}).device_total() <= capacity);
  const auto ratio = smallest_fitting_ratio(in, capacity);
  REQUIRE(ratio.has_value());
  CHECK(*ratio > 0.0);
  CHECK(*ratio < 1.0);
  const auto total_at = [&](double r) {
    Inputs at = in;
    at.engine.offload_optimizer.ratio = r;
    return estimate(at, Setting{3, true, false}).device_total();
  };
  CHECK(total_at(*ratio) <= capacity);        // fits at the ratio named
  CHECK(total_at(*ratio - 0.01) > capacity);  // and not a hundredth below
  std::vector<Estimate> all;
  for (const Setting& s : table_order()) all.push_back(estimate(in, s));
  CHECK_THAT(format_verdict(in, all),
             Catch::Contains(fmt::format("partial optimizer offload fits from "
                                         "offload_optimizer.ratio {:g}",
                                         *ratio)));
  // Where stage 3 fits as it is, there is nothing to split.
  in.device_gib = 80;
  CHECK_FALSE(smallest_fitting_ratio(in, std::llround(80 * 1073741824.0)).has_value());
}

TEST_CASE("a config gives the same inputs as zrt-train runs with") {
  const Config config = parse_config_text(R"({
    "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000,
                          "stage3_param_persistence_threshold": 77,
                          "offload_optimizer": {"device": "cpu", "pin_memory": false}},
    "model": {"preset": "gpt2-tiny", "seq_len": 64, "activation_checkpointing": true},
    "data": {"train": "x_*.bin"},
    "train": {"steps": 1},
    "device": {"type": "cpu", "memory_limit_gb": 2.5}
  })",
                                          4, "mem.json");
  const Inputs in = inputs_from_config(config);
  CHECK(in.world == 4);
  CHECK(in.micro_batch == 3);
  CHECK(in.seq_len == 64);
  CHECK(in.activation_checkpointing);
  CHECK(in.device_gib == 2.5);
  CHECK(in.engine.stage == 3);
  CHECK(in.engine.compute_dtype == DType::kBFloat16);
  CHECK(in.engine.reduce_bucket_size == 1000);
  CHECK(in.engine.stage3_param_persistence_threshold == 77);
  CHECK(in.engine.offload_optimizer.enabled);
  CHECK_FALSE(in.engine.offload_optimizer.pin_memory);
  CHECK_FALSE(in.engine.offload_param.enabled);
  REQUIRE(in.model);
  CHECK(in.model->def->seq_len() == 64);
  CHECK(in.setting() == Setting{3, true, false});
}

TEST_CASE("zrt-mem prints the paper's figures, the table and the verdict") {
  int status = -1;
  const std::string out =
      run_tool("--params 7.5e9 --world 64 --dtype fp16 --grad-accum-dtype fp16", &status);
  CHECK(status == 0);
  INFO(out);
  CHECK_THAT(out,
             Catch::Matches("(.|\n)*  stage 0 +15\\.0 +15\\.0 +30\\.0 +60\\.0 +120\\.0 (.|\n)*"));
  CHECK_THAT(out, Catch::Matches("(.|\n)*  stage 1 +15\\.0 +15\\.0 +0\\.5 +0\\.9 +31\\.4 (.|\n)*"));
  CHECK_THAT(out, Catch::Matches("(.|\n)*  stage 2 +15\\.0 +0\\.2 +0\\.5 +0\\.9 +16\\.6 (.|\n)*"));
  CHECK_THAT(out, Catch::Matches("(.|\n)*  stage 3 +0\\.2 +0\\.2 +0\\.5 +0\\.9 +1\\.9 (.|\n)*"));
  CHECK_THAT(out,
             Catch::Contains("verdict: stage 1 fits a 80 GiB (85.9 GB) device: 31.4 GB per rank"));
}

TEST_CASE("zrt-mem with a model and with a config") {
  int status = -1;
  const std::string xl = run_tool(
      "--model gpt2-xl --world 8 --nodes 2 --stage 3 --offload-optimizer cpu --micro-batch 4 "
      "--seq 1024 --dtype bf16 --device-gb 80",
      &status);
  INFO(xl);
  CHECK(status == 0);
  CHECK_THAT(xl, Catch::Contains("gpt2-xl (L48 H25 C1600 V50257 T1024"));
  CHECK_THAT(xl, Catch::Contains("8 ranks on 2 node(s) (4 per node)"));
  CHECK_THAT(xl, Catch::Contains("stage 3 + optimizer offload — per-rank device memory"));
  CHECK_THAT(xl, Catch::Contains("per-node host memory (4 ranks)"));
  CHECK_THAT(xl, Catch::Contains("verdict: "));
  const std::string partial = run_tool(
      "--model gpt2-xl --stage 3 --offload-optimizer cpu --offload-ratio 0.5 --device-gb 80",
      &status);
  INFO(partial);
  CHECK(status == 0);
  CHECK_THAT(partial,
             Catch::Contains("stage 3 + optimizer offload (ratio 0.5) — per-rank device memory"));
  CHECK_THAT(partial, Catch::Contains("1/1, the part not offloaded"));
  CHECK_THAT(partial, Catch::Contains("1/N, the units not offloaded"));
  // One micro-batch per step (the default without a config): no device gradient slices for the
  // offloaded units; with accumulation (--gas 8) the fp32 slices are back on the device.
  const std::string direct =
      run_tool("--model gpt2 --stage 3 --offload-optimizer cpu --seq 1024", &status);
  INFO(direct);
  CHECK(status == 0);
  CHECK_THAT(direct, Catch::Contains("offloaded as reduced (one micro-batch per step)"));
  CHECK_THAT(direct, Catch::Contains(report_row(
                         "grads", "0.0", "offloaded as reduced (one micro-batch per step)")));
  CHECK_THAT(direct, Catch::Contains(report_row("grads (offloaded slices)", "0.2", "")));
  const std::string accumulated =
      run_tool("--model gpt2 --stage 3 --offload-optimizer cpu --seq 1024 --gas 8", &status);
  INFO(accumulated);
  CHECK(status == 0);
  // One rank has nothing to reduce: full gradients, no buckets (per_micro_batch_grads); two
  // ranks reduce a bucket every micro-batch into their slices.
  CHECK_THAT(accumulated,
             Catch::Contains(report_row("grads", "0.5",
                                        "full, accumulation dtype (one rank: nothing to reduce)")));
  CHECK_THAT(accumulated, Catch::Contains(report_row("buffers: gradient buckets", "0.0",
                                                     "none: one rank accumulates full gradients")));
  CHECK_THAT(accumulated, Catch::Contains(report_row("grads (offloaded slices)", "0.5", "")));
  const std::string two_ranks = run_tool(
      "--model gpt2 --stage 3 --offload-optimizer cpu --seq 1024 --gas 8 --world 2", &status);
  INFO(two_ranks);
  CHECK(status == 0);
  CHECK_THAT(two_ranks, Catch::Contains(report_row("grads", "0.2", "1/N")));
  CHECK_THAT(two_ranks, Catch::Contains(report_row("buffers: gradient buckets", "0.1", "peak")));
  const std::string cfg = run_tool(
      std::string("--config ") + ZRT_SOURCE_DIR + "/configs/stage3.json --world 2", &status);
  INFO(cfg);
  CHECK(status == 0);
  CHECK_THAT(cfg, Catch::Contains("gpt2-tiny"));
  CHECK_THAT(cfg, Catch::Contains("2 ranks on 1 node(s)"));
  CHECK_THAT(cfg, Catch::Contains("micro-batch 8 x 256 tokens"));
  CHECK_THAT(cfg, Catch::Contains("stage 3 — per-rank device memory"));
}

TEST_CASE("zrt-mem rejects bad usage with a message naming the problem") {
  int status = 0;
  CHECK_THAT(run_tool("--world 2", &status),
             Catch::Contains("give exactly one of --model, --params, --config"));
  CHECK(status == 2);
  CHECK_THAT(run_tool("--params 1e9 --wrld 2", &status),
             Catch::Contains("unknown option '--wrld'"));
  CHECK(status == 2);
  CHECK_THAT(run_tool("--params 1e9 --world 6 --nodes 4", &status),
             Catch::Contains("--world 6 is not a multiple of --nodes 4"));
  CHECK(status == 1);
  CHECK_THAT(run_tool("--params lots", &status), Catch::Contains("--params needs a number"));
  CHECK_THAT(run_tool("--model gpt3", &status), Catch::Contains("unknown GPT preset 'gpt3'"));
  CHECK_THAT(run_tool("--params 1e9 --stage 0 --offload-optimizer cpu", &status),
             Catch::Contains("optimizer offload needs ZeRO stage 1, 2 or 3"));
  CHECK_THAT(
      run_tool("--params 1e9 --stage 2 --offload-optimizer cpu --offload-param cpu", &status),
      Catch::Contains("parameter offload needs ZeRO stage 3"));
  CHECK_THAT(run_tool("--params 1e9 --seq 128", &status), Catch::Contains("--seq needs a model"));
  CHECK_THAT(
      run_tool("--params 1e9 --stage 3 --offload-optimizer cpu --offload-ratio 1.5", &status),
      Catch::Contains("--offload-ratio must be in [0, 1], not 1.5"));
  CHECK_THAT(run_tool("--params 1e9 --gas 0", &status),
             Catch::Contains("--gas (gradient_accumulation_steps) must be >= 1, not 0"));
  CHECK_THAT(run_tool("--config /nonexistent.json", &status), Catch::Contains("/nonexistent.json"));
  CHECK(status == 1);
}

// --sp, --micro-batch and --gas enter the config's batch rule: one file tried at sp 1, 2, 4 and
// another world size (the file's own sp or global batch refused them before).
TEST_CASE("zrt-mem --config: --sp and --world applied before the batch rule") {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / "zrt_test_zrt_mem_sp.json";
  std::ofstream(file) << R"({"train_batch_size": 2, "sequence_parallel_size": 4,
      "model": {"type": "llama", "preset": "llama-tiny", "seq_len": 64},
      "data": {"train": "unused"}, "train": {"steps": 1}, "device": {"type": "cpu"}})";
  for (const char* flags : {"--world 4 --sp 4", "--world 4 --sp 2 --micro-batch 1",
                            "--world 2 --sp 2", "--world 4 --sp 1 --micro-batch 1"}) {
    int status = -1;
    const std::string out = run_tool("--config " + file.string() + " " + flags, &status);
    INFO(flags << ":\n" << out);
    CHECK(status == 0);
    CHECK_THAT(out, Catch::Contains("verdict:"));
  }
}

TEST_CASE("Lion keeps 8 bytes of fp32 state per parameter: the paper's setting with Lion") {
  // Ψ = 7.5B, N = 64, fp16 parameters and gradients (2Ψ + 2Ψ), and K = 8 instead of Adam's 12:
  // fp32 master weights (4Ψ) and one fp32 momentum (4Ψ).
  Inputs in = paper_inputs();
  in.optimizer = optimizer_spec(OptimizerKind::kLion);
  const std::int64_t expected[] = {90'000'000'000, 30'937'500'000, 16'171'875'000, 1'406'250'000};
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    CHECK(estimate(in, Setting{stage, false, false}).model_state() == expected[stage]);
  }
  const Estimate s1 = estimate(in, Setting{1, false, false});
  CHECK(s1.master == 468'750'000);
  CHECK(s1.optimizer == 468'750'000);  // 4Ψ/N: half of Adam's two moments
  const Estimate off = estimate(in, Setting{2, true, false});
  CHECK(off.optimizer == 0);
  CHECK(at(off.host_per_rank, MemCategory::kOptimizer) == 468'750'000);

  const Config config = parse_config_text(R"({
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "Lion", "params": {"lr": 1e-4, "weight_decay": 1.0}},
    "model": {"preset": "gpt2-tiny"}, "data": {"train": "x_*.bin"}, "train": {"steps": 1}
  })",
                                          2, "lion.json");
  CHECK(inputs_from_config(config).optimizer.state_bytes_per_parameter() == 8);

  int status = -1;
  const std::string out = run_tool(
      "--params 7.5e9 --world 64 --dtype fp16 --grad-accum-dtype fp16 --optimizer lion", &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("optimizer Lion: 8 bytes of fp32 state per parameter"));
  CHECK_THAT(out, Catch::Contains("optimizer (Lion momentum, fp32)"));
  CHECK_THAT(out,
             Catch::Matches("(.|\n)*  stage 0 +15\\.0 +15\\.0 +30\\.0 +30\\.0 +90\\.0 (.|\n)*"));
  CHECK_THAT(out, Catch::Matches("(.|\n)*  stage 3 +0\\.2 +0\\.2 +0\\.5 +0\\.5 +1\\.4 (.|\n)*"));
  const std::string adam = run_tool("--params 7.5e9 --world 64 --optimizer adamw", &status);
  CHECK_THAT(adam, Catch::Contains("optimizer Adam: 12 bytes of fp32 state per parameter"));
  run_tool("--params 7.5e9 --optimizer sgd", &status);
  CHECK(status != 0);
}

TEST_CASE("ZeRO++: the quantized collectives' scratch and qgZ's output slice, by hand") {
  // Two modules of one 64 x 64 weight each: at stage 3 over 4 ranks a unit per module, 4096
  // elements, slices s = 1024. A quantized slice is W = ceil(1024/4) + ceil(1024/2048) = 257
  // words, 1028 bytes. On 2 nodes of 2 (n = 4, M = 2):
  //   qwZ gather:         slot 0 = 1028, slot 1 = 4 x 1028 = 4112
  //   qgZ reduce-scatter: slots 0, 1 = 4 x 1028 = 4112, slot 2 = M s 4 = 8192, slot 3 = 4096
  //   qgZ output slice:   1024 bf16 = 2048
  // qwZ alone 1028 + 4112 = 5140; qgZ (and both) 4112 + 4112 + 8192 + 4096 + 2048 = 22560; on
  // one node (M = 1) slot 2 is 4096: 18464. CUDA: no MPI scratch, the bf16 wire needs no
  // conversion buffer, so these are the whole comm figure.
  ModelSpec model;
  model.params = {ParamSpec{"a", {64, 64}, {0}, false}, ParamSpec{"b", {64, 64}, {1}, false}};
  model.num_modules = 2;
  Inputs in;
  in.model = model;
  in.world = 4;
  in.nodes = 2;
  in.device_type = DeviceType::kCuda;
  in.engine.compute_dtype = DType::kBFloat16;
  in.engine.stage3_param_persistence_threshold = 0;
  const auto comm = [&](bool weights, bool gradients, int nodes, int stage = 3) {
    Inputs q = in;
    q.nodes = nodes;
    q.engine.quantized_weights = weights;
    q.engine.quantized_gradients = gradients;
    const Estimate e = estimate(q, Setting{stage, false, false});
    CHECK(e.comm == e.quantized_comm);
    return e.quantized_comm;
  };
  CHECK(comm(false, false, 2) == 0);
  CHECK(comm(true, false, 2) == 5140);
  CHECK(comm(false, true, 2) == 22560);
  CHECK(comm(true, true, 2) == 22560);
  CHECK(comm(false, true, 1) == 18464);
  // Stage 2: one gradient bucket of both weights, 8192 elements, s = 2048, W = 513 words:
  // 2 x 4 x 2052 + 2 x 2048 x 4 + 2048 x 4 + 2048 x 2 = 45088.
  CHECK(comm(false, true, 2, 2) == 45088);
  CHECK(comm(true, false, 2, 2) == 0);  // qwZ quantizes stage 3's gathers only
  // zrt-mem shows the figure when the keys are set.
  Inputs shown = in;
  shown.engine.quantized_gradients = true;
  const Estimate chosen = estimate(shown, Setting{3, false, false});
  const std::string report = format_report(shown, chosen, {chosen});
  CHECK_THAT(report, Catch::Contains("of which ZeRO++ (qwZ / qgZ)"));
  CHECK_THAT(report, Catch::Contains("22560 bytes"));
}

namespace {

// The estimate of `def` at seq_len T for a setting (what longest_sequence compares).
// A model in bf16 with activation checkpointing: the long-sequence searches' inputs.
Inputs checkpointed_bf16(const std::shared_ptr<const ModelDef>& def) {
  Inputs in;
  in.model = model_spec(def);
  in.engine.compute_dtype = DType::kBFloat16;
  in.activation_checkpointing = true;
  return in;
}

Estimate estimate_at(const ModelDef& def, Inputs in, const Setting& s, int T) {
  in.model = model_spec(def.with_seq_len(T));
  in.seq_len = T;
  return estimate(in, s);
}

}  // namespace

TEST_CASE("--max-seq-len: the longest length fits, the next multiple does not") {
  const auto gpt = builtin_models().parse_spec("gpt2");
  Inputs in;
  in.world = 2;
  in.micro_batch = 2;
  in.engine.compute_dtype = DType::kBFloat16;
  in.activation_checkpointing = true;
  const std::int64_t capacity = std::int64_t{3} << 30;  // 3 GiB per rank
  for (const Setting& s : verdict_order()) {
    const SequenceFit fit = longest_sequence(*gpt, in, s, capacity, 0, 64);
    INFO(in.name(s) << ": " << fit.seq_len << " tokens, next stopped by " << fit.limit);
    REQUIRE(fit.seq_len > 0);
    CHECK(fit.seq_len % 64 == 0);
    CHECK(fit.limit == "device");
    CHECK(fit.estimate.device_total() == estimate_at(*gpt, in, s, fit.seq_len).device_total());
    CHECK(fit.estimate.device_total() <= capacity);
    CHECK(estimate_at(*gpt, in, s, fit.seq_len + 64).device_total() > capacity);
  }
  // More sharding never makes the longest sequence shorter here: stage 3 with both offloads
  // keeps the least model state on the device.
  const int s0 = longest_sequence(*gpt, in, verdict_order().front(), capacity, 0, 64).seq_len;
  const int s3 = longest_sequence(*gpt, in, verdict_order().back(), capacity, 0, 64).seq_len;
  CHECK(s3 > s0);
}

TEST_CASE("--max-seq-len: the host per node and the model's own limit stop it too") {
  Inputs in;
  in.engine.compute_dtype = DType::kBFloat16;
  const Setting offload{3, true, true};
  // Llama's positions end at max_position_embeddings: a device of 1 TiB reaches them.
  const auto llama = builtin_models().parse_spec("llama-tiny");
  const SequenceFit capped = longest_sequence(*llama, in, offload, std::int64_t{1} << 40, 0, 64);
  INFO(capped.limit);
  // A table cell: the bound alone, without the source location or the remedy.
  CHECK_THAT(capped.limit, Catch::Matches("model\\.seq_len=[0-9]+ exceeds "
                                          "max_position_embeddings=[0-9]+"));
  CHECK(capped.seq_len > 0);
  CHECK_THROWS_AS(llama->with_seq_len(capped.seq_len + 64), InvalidArgument);
  // Host memory: the offloaded state alone exceeds a 1 MiB host, so nothing fits, for that reason.
  const auto gpt = builtin_models().parse_spec("gpt2");
  const SequenceFit host = longest_sequence(*gpt, in, offload, std::int64_t{80} << 30, 1 << 20, 64);
  CHECK(host.seq_len == 0);
  CHECK(host.limit == "host");
  CHECK_THROWS_AS(longest_sequence(*gpt, in, offload, std::int64_t{80} << 30, 0, 0),
                  InvalidArgument);
}

// On a GPU the plan counts cuDNN's attention workspace, which grows with T^2 until the backward's
// passes the automatic 8 GiB limit and zrt's kernels take it (kernels/ops.h): for Llama-3.1-8B at
// one sequence, up to 11 456 tokens (8.59e9 bytes), none from 11 520. A device holding exactly
// 11 520 tokens on zrt's kernels does not hold 8192 or 11 456 with cuDNN's workspace, so a search
// that doubles to 8192 and bisects below it would answer under 8192; the answer is 11 520.
TEST_CASE(
    "--max-seq-len: cuDNN's attention workspace dropping at its limit does not end the "
    "search early") {
  const std::shared_ptr<const ModelDef> llama = builtin_models().parse_spec("llama-3.1-8b");
  Inputs in = checkpointed_bf16(llama);
  in.cpu_checkpointing = true;
  const Setting s{3, true, false};
  Inputs own = in;
  own.documents = true;  // zrt's kernels throughout
  const std::int64_t capacity = estimate_at(*llama, own, s, 11520).device_total();
  const bool plans_cudnn = estimate_at(*llama, in, s, 8192).kernel_workspace >
                           estimate_at(*llama, own, s, 8192).kernel_workspace;
  INFO("cuDNN's attention planned: " << plans_cudnn);
  if (plans_cudnn) {
    CHECK(estimate_at(*llama, in, s, 11456).kernel_workspace >= 8588517376);
    CHECK(estimate_at(*llama, in, s, 11520).kernel_workspace ==
          estimate_at(*llama, own, s, 11520).kernel_workspace);
    CHECK(estimate_at(*llama, in, s, 8192).device_total() > capacity);
    CHECK(estimate_at(*llama, in, s, 11456).device_total() > capacity);
  }
  const SequenceFit fit = longest_sequence(*llama, in, s, capacity, 0, 64);
  INFO(fit.seq_len << " tokens, next stopped by " << fit.limit);
  CHECK(fit.seq_len == 11520);
  CHECK(fit.limit == "device");
  CHECK(fit.estimate.device_total() == capacity);
  // With packed documents the plan is zrt's kernels' throughout: the same answer.
  CHECK(longest_sequence(*llama, own, s, capacity, 0, 64).seq_len == 11520);
}

// The MLP's automatic tiles start where its six (rows, 14 336) tensors pass 4 GiB (Llama-3.1-8B:
// 24 966 rows) and hold 1 GiB from there, so the footprint drops at 25 024 tokens (3 GB less
// than at 24 960). A device holding 28 672 tokens in tiles does not hold 24 960 whole: a search
// that doubled to 16 384, missed at 32 768 and bisected through 24 576 answered 22 016 (zrt-mem
// before 2026-12-01, at --device-gb 29.8); the answer is the tiled stretch's longest.
TEST_CASE(
    "--max-seq-len: the MLP's tiles starting (its footprint dropping) does not end the "
    "search early") {
  const std::shared_ptr<const ModelDef> llama = builtin_models().parse_spec("llama-3.1-8b");
  Inputs in = checkpointed_bf16(llama);
  in.documents = true;  // zrt's attention kernels throughout: only the tiles switch
  const Setting s{3, true, false};
  const std::int64_t capacity = estimate_at(*llama, in, s, 28672).device_total();
  REQUIRE(estimate_at(*llama, in, s, 24960).device_total() > capacity);  // whole: the drop
  REQUIRE(estimate_at(*llama, in, s, 16384).device_total() <= capacity);
  const SequenceFit fit = longest_sequence(*llama, in, s, capacity, 0, 64);
  INFO(fit.seq_len << " tokens, next stopped by " << fit.limit);
  CHECK(fit.seq_len == 28672);
  CHECK(fit.limit == "device");
  CHECK(fit.estimate.device_total() == capacity);
  // Every length between the drop and the answer fits; none past it does (the footprint grows
  // in the tiled stretch).
  for (int T = 25024; T <= 28672; T += 512) {
    CHECK(estimate_at(*llama, in, s, T).device_total() <= capacity);
  }
  CHECK(estimate_at(*llama, in, s, 28736).device_total() > capacity);
}

TEST_CASE("zrt-mem --max-seq-len prints a line per setting") {
  int status = -1;
  const std::string out = run_tool(
      "--model gpt2 --max-seq-len --device-gb 16 --host-gb 64 --seq-multiple 128", &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("longest sequence per setting: gpt2 on 1 rank(s)"));
  CHECK_THAT(out, Catch::Contains("64.0 GiB host per node; lengths in multiples of 128"));
  CHECK_THAT(out, Catch::Matches("(.|\n)*  stage 3 \\+ optimizer and parameter offload +[0-9]+ "
                                 "tokens  device +[0-9.]+ GiB(.|\n)*"));
  const std::string none = run_tool("--params 1e9 --max-seq-len", &status);
  CHECK(status == 2);
  CHECK_THAT(none, Catch::Contains("--max-seq-len needs a model"));
  // The model's own seq_len need not split over --sp: the search sets the length (8192 tokens
  // at sp 3 was refused before the search began).
  const std::string sp3 = run_tool(
      "--model smollm2-135m --max-seq-len --activation-checkpointing --device-gb 4 --sp 3 "
      "--world 3 --seq-multiple 192",
      &status);
  INFO(sp3);
  CHECK(status == 0);
  CHECK_THAT(sp3, Catch::Contains("sequence_parallel_size 3"));
}

TEST_CASE("--max-seq-len: cpu_checkpointing and tiling give a longer sequence, exactly fitted") {
  const auto llama = builtin_models().parse_spec("llama-3.2-1b");
  Inputs in;
  in.engine.compute_dtype = DType::kBFloat16;
  in.activation_checkpointing = true;
  const Setting s{3, true, true};
  const std::int64_t capacity = std::int64_t{8} << 30;
  in.head_tile_rows = in.mlp_tile_rows = -1;  // neither
  const SequenceFit plain = longest_sequence(*llama, in, s, capacity, 0, 256);
  in.cpu_checkpointing = true;
  const SequenceFit offloaded = longest_sequence(*llama, in, s, capacity, 0, 256);
  in.head_tile_rows = in.mlp_tile_rows = 0;  // automatic tiling too
  const SequenceFit both = longest_sequence(*llama, in, s, capacity, 0, 256);
  INFO(plain.seq_len << " plain, " << offloaded.seq_len << " with cpu_checkpointing, "
                     << both.seq_len << " with tiling too");
  CHECK(plain.seq_len > 0);
  CHECK(offloaded.seq_len > plain.seq_len);
  CHECK(both.seq_len > offloaded.seq_len);
  CHECK(both.limit == "device");
  CHECK(both.estimate.device_total() <= capacity);
  CHECK(estimate_at(*llama, in, s, both.seq_len + 256).device_total() > capacity);
  // The offloaded block inputs are host memory: 14 of llama-3.2-1b's 16 blocks, (T, 2048) bf16.
  CHECK(at(both.estimate.host_per_rank, MemCategory::kActivations) ==
        std::int64_t{14} * both.seq_len * 2048 * 2);
}

TEST_CASE(
    "a mixture of experts: the model state holds every expert, the report and MFU the "
    "active ones") {
  const std::shared_ptr<const ModelDef> def =
      builtin_models().parse_spec("qwen3-30b-a3b:seq_len=4096");
  const ModelSpec model = model_spec(def);
  Inputs in;
  in.model = model;
  in.world = 8;
  in.seq_len = 4096;
  in.engine.compute_dtype = DType::kBFloat16;
  in.engine.grad_accum_dtype = DType::kBFloat16;
  const Estimate e = estimate(in, Setting{3, false, false});
  // Ψ is every parameter (30.5B), not the 3.3B a token uses.
  CHECK(e.content_params == def->num_parameters());
  CHECK(def->num_parameters() == 30532122624);
  CHECK(def->num_active_parameters() == 3353032704);
  const std::string report = format_report(in, e, {e});
  CHECK(report.find("3353032704 active per token") != std::string::npos);
  // MFU's FLOPs per token: 6 per active weight a token multiplies (not the embedding table,
  // only looked up) plus attention's 12 L (NH hd) T.
  const double expected = 6.0 * (3353032704.0 - 151936.0 * 2048) + 12.0 * 48 * 32 * 128 * 4096;
  CHECK(def->flops_per_token(4096) == Approx(expected).epsilon(1e-12));
  // A dense model's active count is its count: no such line.
  const ModelSpec dense = model_spec(builtin_models().parse_spec("llama-tiny"));
  Inputs d;
  d.model = dense;
  d.seq_len = 256;
  const Estimate de = estimate(d, Setting{0, false, false});
  CHECK(format_report(d, de, {de}).find("active per token") == std::string::npos);
}

TEST_CASE("--sp: a rank holds its chunk's activations, attention's workspace spans the sequence") {
  // Llama-3.1-8B at 32K tokens on 4 ranks, checkpointing with the kept inputs in host memory,
  // untiled: the issue's bound, a rank's activations at sp 4 at most 0.4 of one rank holding the
  // whole sequence (0.27 here; the automatic tiles' fixed sizes count for more at 32K, 0.54,
  // and fall under it at 128K, 0.39).
  const std::shared_ptr<const ModelDef> llama =
      builtin_models().parse_spec("llama-3.1-8b:seq_len=32768");
  Inputs in;
  in.model = model_spec(llama);
  in.world = 4;
  in.seq_len = 32768;
  in.engine.compute_dtype = DType::kBFloat16;
  in.activation_checkpointing = true;
  in.cpu_checkpointing = true;
  in.head_tile_rows = in.mlp_tile_rows = -1;
  const Setting s{3, true, false};
  const Estimate whole = estimate(in, s);
  in.engine.sequence_parallel_size = 4;
  const Estimate quarter = estimate(in, s);
  INFO(whole.activations() << " bytes of activations at sp 1, " << quarter.activations()
                           << " at sp 4");
  CHECK(quarter.activations() <= 0.4 * static_cast<double>(whole.activations()));
  CHECK(quarter.model_state_peak() == whole.model_state_peak());  // ZeRO over the whole world
  CHECK(at(quarter.host_per_rank, MemCategory::kActivations) * 4 ==
        at(whole.host_per_rank, MemCategory::kActivations));  // the chunk's block inputs
  // The CPU attention's workspace, through the kernels' own size functions: over the whole
  // sequence with a rank's heads (llama-tiny: 4 query heads of 16, 2 key/value heads; at sp 4 one
  // and one), the forward's request then the backward's, grown as KernelContext grows it.
  const std::shared_ptr<const ModelDef> small =
      builtin_models().parse_spec("llama-tiny:seq_len=256");
  Inputs cpu;
  cpu.model = model_spec(small);
  cpu.world = 4;
  cpu.seq_len = 256;
  cpu.device_type = DeviceType::kCpu;
  cpu.engine.compute_dtype = DType::kFloat32;
  const auto expected = [](int NH, int NKV) {
    const kernels::KernelOptions options;
    const auto request = [&](bool backward) {
      return kernels::gqa_attention_workspace_bytes(true, options, DType::kFloat32, 1, 256, NH, NKV,
                                                    16, backward);
    };
    using kernels::KernelContext;
    return KernelContext::grown_workspace_bytes(
        KernelContext::grown_workspace_bytes(0, request(false)), request(true));
  };
  CHECK(estimate(cpu, Setting{0, false, false}).kernel_workspace == expected(4, 2));
  cpu.engine.sequence_parallel_size = 4;
  CHECK(estimate(cpu, Setting{0, false, false}).kernel_workspace == expected(1, 1));
  CHECK(expected(1, 1) < expected(4, 2));
  // The command line: --sp, and a config's sequence_parallel_size, in the report's header.
  int status = -1;
  const std::string out = run_tool("--model llama-tiny --world 4 --sp 4", &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("micro-batch 1 x 256 tokens in 4 chunks of 64"));
  CHECK_THAT(out, Catch::Contains("buffers: kernel workspace"));
  run_tool("--model llama-tiny --world 4 --sp 3", &status);
  CHECK(status != 0);
}

// Every build, one without CUDA too (a login node's), plans the GPU's grouped-query attention by
// the kernels' own size functions (kernels/cuda/attention_plan.h: host code, no GPU or CUDA
// toolkit needed). Llama-3.1-8B's attention (32 query heads of 128 over 8 key/value
// heads) at 128K tokens in bf16: the fused kernels read q, k, v in place, so the backward's
// workspace is its (B,NH,T) fp32 row term alone, 16 MiB, where packing q and the repeated k, v
// (KernelOptions::cuda_gqa_packed, and any shape the fused kernels do not take) costs two
// (B,T,3C) bf16 tensors on top, 6 GiB. The plan of configs/gpu-llama-3.1-8b-offload.json at
// 128K follows it: zrt-mem counts the kernel workspace at the in-place size.
TEST_CASE("zrt-mem plans CUDA's grouped-query attention in place: 16 MiB at 128K, not 6 GiB") {
  const int T = 131072, NH = 32, NKV = 8, hs = 128;
  const std::int64_t row_term = std::int64_t{NH} * T * 4;         // B = 1, fp32
  const std::int64_t packed = std::int64_t{T} * 3 * NH * hs * 2;  // (B,T,3C) bf16
  kernels::KernelOptions in_place;
  in_place.cuda_fused_attention =
      kernels::FusedAttention::kAll;      // whatever ZRT_CUDA_ATTENTION says
  in_place.cuda_attention_cudnn = false;  // zrt's kernels (cuDNN's: the case below)
  kernels::KernelOptions packing = in_place;
  packing.cuda_gqa_packed = true;
  const auto bytes = [&](const kernels::KernelOptions& options, int t, bool backward) {
    return kernels::gqa_attention_workspace_bytes(false, options, DType::kBFloat16, 1, t, NH, NKV,
                                                  hs, backward);
  };
  CHECK(bytes(in_place, T, false) == 0);
  CHECK(bytes(in_place, T, true) == row_term);
  CHECK(bytes(packing, T, false) == packed);                // the fused forward needs nothing more
  CHECK(bytes(packing, T, true) == 2 * packed + row_term);  // q, k, v and their gradient
  // A length the fused kernels do not take (not a multiple of 64) packs whatever is asked.
  CHECK(bytes(in_place, 4000, true) == bytes(packing, 4000, true));
  CHECK(bytes(in_place, 4000, true) > 2 * std::int64_t{4000} * 3 * NH * hs * 2);
  // fp32 takes the batched kernels: the packed qkv in fp32, then the fp32 q, k, v, y and the
  // (B,NH,T,T) scores (the term a plan without it would miss: 2 GiB at 4096 tokens).
  const std::int64_t t = 4096, C = std::int64_t{NH} * hs;
  CHECK(kernels::gqa_attention_workspace_bytes(false, in_place, DType::kFloat32, 1, 4096, NH, NKV,
                                               hs, false) ==
        t * 3 * C * 4 + (4 * t * C + NH * t * t) * 4);

  const std::shared_ptr<const ModelDef> llama =
      builtin_models().parse_spec("llama-3.1-8b:seq_len=131072");
  Inputs in;
  in.model = model_spec(llama);
  in.seq_len = T;
  in.engine.compute_dtype = DType::kBFloat16;
  in.activation_checkpointing = true;
  in.cpu_checkpointing = true;
  const Estimate e = estimate(in, Setting{3, true, false});
  INFO("kernel workspace " << e.kernel_workspace);
  CHECK(e.kernel_workspace >= row_term);
  CHECK(e.kernel_workspace < packed / 8);
}

// Under the default attention (cuDNN's where the calls take it, its deterministic backward
// within 8 GiB of workspace), Llama-3.1-8B's 2048-token step plans cuDNN's request, 302 252 288
// bytes: what cuDNN 9.19 asked for on an H200 (the run's tracker showed 0.28 GiB more than the
// same run on zrt's kernels, BENCHMARKS.md). Packed documents and lengths whose backward would
// need more than the limit (T^2 growth) plan zrt's kernels' (B,NH,T) fp32 row term. A build
// with CUDA but without cuDNN attention plans zrt's kernels throughout, as it runs them.
TEST_CASE("zrt-mem plans cuDNN's attention workspace where the calls take it") {
  const int NH = 32, NKV = 8, hs = 128;
  kernels::KernelOptions automatic;
  automatic.cuda_fused_attention = kernels::FusedAttention::kAll;
  automatic.cuda_attention_pipelined = true;
  automatic.cuda_attention_cudnn = true;
  automatic.cuda_attention_cudnn_required = false;
  automatic.cuda_attention_cudnn_deterministic = true;
  automatic.cuda_attention_cudnn_workspace_limit = kernels::kCudnnAttentionAutoWorkspaceLimit;
  const bool plans_cudnn = kernels::describe_cuda_attention(automatic).rfind("cuDNN", 0) == 0;
  INFO(kernels::describe_cuda_attention(automatic));
  const auto bytes = [&](int T, bool documents) {
    return kernels::gqa_attention_workspace_bytes(false, automatic, DType::kBFloat16, 1, T, NH, NKV,
                                                  hs, true, documents);
  };
  const auto row_term = [&](int T) { return std::int64_t{NH} * T * 4; };
  CHECK(bytes(2048, false) == (plans_cudnn ? 302252288 : row_term(2048)));
  CHECK(bytes(2048, true) == row_term(2048));
  CHECK(bytes(8192, false) == (plans_cudnn ? 4430233856 : row_term(8192)));  // within 8 GiB
  CHECK(bytes(16384, false) == row_term(16384));  // 17.7 GB: over the limit
  CHECK(kernels::gqa_attention_workspace_bytes(false, automatic, DType::kBFloat16, 1, 2048, NH, NKV,
                                               hs, false) == (plans_cudnn ? 256 : 0));
}

TEST_CASE("--sp: the device bytes a token adds shrink about as 1/sp (the long-sequence config)") {
  // configs/long-sequence-cpu.json's model (12 layers of 256, 4 query heads of 64 over 2
  // key/value heads, so one key/value head copied per rank at sp 4) on the CPU backend at 4
  // ranks, fp32, checkpointing with the kept inputs in host memory, 512-row tiles, stage 3 (the
  // model state the same at every sp): the slope between 8K and 16K tokens. Per token of the
  // sequence: 18496 bytes at sp 1, 10276 at sp 2, 5650 at sp 4 (24640, 16432, 8740 when each
  // chunk's and its whole sequence's layouts had buffers of their own and grouped-query attention
  // packed q, k, v). What does not divide by sp at sp 4: the copied key/value head's k, v, dk,
  // dv (512 a token), the whole sequence's attention output kept beside the chunk's (256) and
  // the all-to-alls' one staging buffer (256).
  const auto device_bytes = [](int sp, int T) {
    Inputs in;
    in.model = model_spec(builtin_models().parse_spec(
        "llama:hidden_size=256,intermediate_size=1024,num_hidden_layers=12,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=8192,"
        "max_position_embeddings=65536,seq_len=" +
        std::to_string(T)));
    in.world = 4;
    in.seq_len = T;
    in.device_type = DeviceType::kCpu;
    in.engine.compute_dtype = DType::kFloat32;
    in.engine.sequence_parallel_size = sp;
    in.activation_checkpointing = true;
    in.cpu_checkpointing = true;
    in.head_tile_rows = in.mlp_tile_rows = 512;
    return estimate(in, Setting{3, false, false}).device_total();
  };
  const auto slope = [&](int sp) {
    return (device_bytes(sp, 16384) - device_bytes(sp, 8192)) / 8192;
  };
  const std::int64_t one = slope(1), two = slope(2), four = slope(4);
  INFO("bytes a token at sp 1, 2, 4: " << one << ", " << two << ", " << four);
  CHECK(one == 18496);
  CHECK(two == 10276);
  CHECK(four == 5650);
  CHECK(2 * two <= 1.12 * static_cast<double>(one));
  CHECK(4 * four <= 1.25 * static_cast<double>(one));
}

TEST_CASE("zrt-mem at expert parallelism: the experts' own units, the dispatch's buffers, --ep") {
  // qwen3-moe-tiny: C 16, 2 MoE layers of E 8 experts, k 3, moe_intermediate 8. At ep 2 a rank
  // holds 4 experts of each layer: 4 x (2*8*16 + 16*8) = 1536 elements a layer, 3072 in all,
  // each parameter at a multiple of the alignment (64) already. At stage 2 (one bucket per group,
  // DeepSpeed's bucket size) they are one unit, padded to a multiple of 64 x (world / ep = 2):
  // 3072, a slice of 1536; the dense parameters are the other unit, over the world of 4.
  const auto def = builtin_models().parse_spec("qwen3-moe-tiny");
  Inputs in;
  in.model = model_spec(std::shared_ptr<const ModelDef>(def->with_seq_len(64)));
  in.world = 4;
  in.seq_len = 64;
  in.engine.stage = 2;
  in.engine.compute_dtype = DType::kBFloat16;
  in.engine.expert_parallel_size = 2;
  REQUIRE_NOTHROW(in.validate());
  const Estimate e = estimate(in, Setting{2, false, false});
  CHECK(e.expert_padded_params == 3072);
  CHECK(e.expert_shard_params == 1536);
  const std::int64_t experts_elsewhere = 2 * 4 * (2 * 8 * 16 + 16 * 8);
  CHECK(e.content_params == def->num_parameters() - experts_elsewhere);
  const std::int64_t dense_padded = e.padded_params - e.expert_padded_params;
  CHECK(dense_padded % (64 * 4) == 0);
  // Stage 2: full bf16 parameters of the rank's units; fp32 master and Adam's two moments of its
  // slices: the dense ones over 4 ranks, the experts' over 2.
  CHECK(e.params == 2 * e.padded_params);
  CHECK(e.master == 4 * (dense_padded / 4 + 1536));
  CHECK(e.optimizer == 2 * e.master);
  // The norm: a float per group. The dispatch: two int64 count vectors of E, and in the
  // activations the local experts' rows for ep x N x k.
  CHECK(e.dispatch_comm == 2 * 8 * 8);
  CHECK(e.dispatch_activations > 0);
  Inputs local = in;
  local.engine.expert_parallel_size = 1;
  const Estimate l = estimate(local, Setting{2, false, false});
  CHECK(e.workspace == l.workspace + 4);
  CHECK(l.expert_padded_params == 0);
  CHECK(l.dispatch_comm == 0);
  CHECK(e.activations() == l.activations() + e.dispatch_activations);
  CHECK(e.model_state() < l.model_state());
  // Stage 0: every unit whole, the experts' too (only this rank's), nothing sliced.
  const Estimate s0 = estimate(in, Setting{0, false, false});
  CHECK(s0.expert_shard_params == s0.expert_padded_params);
  CHECK(s0.master == 4 * s0.padded_params);
  // A degree that does not divide the experts, a model without experts, no model.
  Inputs odd = in;
  odd.world = 6;
  odd.engine.expert_parallel_size = 3;
  CHECK_THROWS_WITH(odd.validate(), Catch::Contains("does not divide the 8 experts"));
  Inputs dense = in;
  dense.model = model_spec(builtin_models().parse_spec("llama-tiny"));
  dense.seq_len = dense.model->def->seq_len();
  CHECK_THROWS_WITH(dense.validate(), Catch::Contains("has no experts"));
  Inputs formula = in;
  formula.model.reset();
  formula.params = 1e9;
  CHECK_THROWS_WITH(formula.validate(), Catch::Contains("needs a model"));
  // The command line: --ep in the header, every setting in the table.
  int status = -1;
  const std::string out = run_tool("--model qwen3-moe-tiny --world 4 --ep 2", &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("expert parallelism (expert_parallel.autoep_size 2)"));
  CHECK_THAT(out, Catch::Contains("1/2 of every MoE layer's experts"));
  CHECK_THAT(out, Catch::Contains("stage 1 + optimizer offload"));
  CHECK_THAT(out, Catch::Contains("  stage 0  "));
  const std::string longest =
      run_tool("--model qwen3-moe-tiny --world 4 --ep 4 --max-seq-len --device-gb 0.001", &status);
  INFO(longest);
  CHECK(status == 0);
  CHECK_THAT(longest, Catch::Contains("expert_parallel.autoep_size 4"));
  run_tool("--model qwen3-moe-tiny --world 4 --ep 3", &status);
  CHECK(status != 0);
  run_tool("--model qwen3-moe-tiny --world 4 --ep 2 --stage 0", &status);
  CHECK(status == 0);
  // MiCS with --ep: shard groups of 2 hold one rank of each expert-data-parallel group ({0,2},
  // {1,3}), so each rank keeps its experts whole (in 2 copies) and the dense units in halves:
  // the master weights of the experts' 3072 elements and the dense ones over 2.
  Inputs mics = in;
  mics.engine.mics_shard_size = 2;
  REQUIRE_NOTHROW(mics.validate());
  const Estimate m = estimate(mics, Setting{2, false, false});
  CHECK(m.expert_shard_params == 3072);
  CHECK(m.master == 4 * (m.padded_params - m.expert_padded_params) / 2 + 4 * 3072);
  const std::string grouped =
      run_tool("--model qwen3-moe-tiny --world 4 --ep 2 --mics 2 --stage 2", &status);
  INFO(grouped);
  CHECK(status == 0);
  CHECK_THAT(grouped, Catch::Contains("sliced over 1 rank(s) of its expert-data-parallel group "
                                      "of 2 (MiCS: the group's ranks in a shard group)"));
  // 6 ranks in shard groups of 3 at ep 2 hold 2 ranks of one expert set and 1 of the other:
  // refused by name, as zrt-train's layout refuses it.
  const std::string uneven =
      run_tool("--model qwen3-moe-tiny --world 6 --ep 2 --mics 3 --stage 2", &status);
  CHECK(status != 0);
  CHECK_THAT(uneven, Catch::Contains("mics_shard_size 3 with expert_parallel.autoep_size 2: the "
                                     "shard groups hold unequal numbers of ranks"));
  run_tool("--model qwen3-moe-tiny --world 4 --mics 0", &status);
  CHECK(status != 0);
}

// The tiles zrt-mem plans (model.tiling), a line after the micro-batch's: the automatic rule on
// Llama-3.1-8B at 128K tokens in bf16 (the head's 1 GiB of logits: 4160 rows of the padded
// 128 256-word vocabulary; the MLP's six (rows, 14 336) tensors in about 1 GiB: 6 208 rows), an
// explicit count on a mixture of experts with a dense layer (its MoE layers and dense MLP alike,
// the short last tile counted), and GPT-2, which tiles its head only.
TEST_CASE("zrt-mem reports the rows and tiles of the tiled head, MLP and MoE layers") {
  int status = 0;
  std::string out = run_tool(
      "--model llama-3.1-8b:seq_len=131072 --seq 131072 --activation-checkpointing", &status);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("tiles of the 131072 rows a pass (model.tiling): head 4160 rows "
                                  "(32 tiles), MLP 6208 rows (22 tiles)\n"));
  out = run_tool("--model qwen2-moe-tiny --seq 64 --mlp-tile-rows 20", &status);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("tiles of the 64 rows a pass (model.tiling): head whole, MLP 20 "
                                  "rows (4 tiles), MoE layers 20 rows (4 tiles)\n"));
  out = run_tool("--model gpt2 --seq 1024", &status);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("tiles of the 1024 rows a pass (model.tiling): head whole\n"));
}
