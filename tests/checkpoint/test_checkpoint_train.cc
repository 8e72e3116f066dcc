// zrt-train's checkpoints end to end, in real processes (mpirun zrt-train, a new job per run):
//  - resume at the same world size and stage is bit-exact: K steps, save, a new job for K more
//    gives the losses and the saved master weights and Adam moments of 2K steps in one job, bit
//    for bit (stage 1, and stage 3 + optimizer offload in bf16, both with async saves whose
//    state copy is held back 200 ms, so the next step must wait for it);
//  - resume at another world size or stage (4->2, 2->3, 3->4, stage 2->3, 3->1, global batch
//    fixed) lands within per-tensor relative error 1e-5 of the uninterrupted run;
//  - a rank SIGKILLed midway through its file leaves `latest` on the previous checkpoint, which
//    then loads; a rank that cannot see rank 0's probe fails the save, naming the directory;
//  - a failed async save is logged by the writer thread and makes zrt-train exit non-zero;
//  - a rank file from another save (or in another rank's place) is refused by the resume,
//    zrt-ckpt verify and consolidate;
//  - zrt-ckpt inspect / verify / consolidate / export, the export loadable by model.init_from's
//    reader and by torch (skipped with a message when python3 has no torch); export creates its
//    folder, a failed write says why, --help, the loss scale shown for fp16 runs only;
//  - metrics.jsonl is one history across a crash and its resume (rows past the checkpoint
//    dropped, the resumed run's rows appended, time and elapsed_s in each) and a no-op restart;
//  - checkpoint.load "auto" (the default) resumes; "none" refuses to save over existing
//    checkpoints before training, unless checkpoint.overwrite.
//  - hpZ (zero_hpz_partition_size 2) at 4 ranks as 2 nodes x 2, with and without offload,
//    trains exactly as plain stage 3 (losses and saved state bit for bit) while every step
//    sends fewer bytes across nodes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/gpt/gpt.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_safetensors.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/checkpoint/save_dir_lock.h"
#include "runtime/data/token_shard.h"
#include "tests/checkpoint/compare_runs.h"

using namespace zrt;
using namespace zrt::checkpoint;
using zrt::test::latest_dir;
using zrt::test::require_identical_state;
namespace fs = std::filesystem;

namespace {

const fs::path& root() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / "zrt_test_ckpt_train";
    fs::remove_all(d);
    fs::create_directories(d);
    std::string text;
    for (int i = 0; i < 400; ++i) text += "In the beginning was the Word, and the Word was God. ";
    std::vector<std::uint16_t> tokens(text.begin(), text.end());
    write_shard((d / "t_train_000000.bin").string(), tokens.data(), tokens.size());
    return d;
  }();
  return dir;
}

struct Job {
  int ranks = 2;
  int stage = 2;
  int steps = 6;
  int save_interval = 0;
  std::string save_dir;
  std::string load;  // "" (the default, auto) or "auto", "none", "latest" or a tag
  bool overwrite = false;
  bool async = false;
  bool offload = false;
  bool bf16 = false;
  bool fp16 = false;
  bool lion = false;         // optimizer Lion instead of AdamW
  bool keep_output = false;  // run again in the output directory of an earlier run
  std::string env;           // extra environment, "NAME=value ..."
  int ranks_per_node = 0;    // comm.ranks_per_node (0: the machine's topology)
  int accumulation = 0;      // gradient_accumulation_steps (0: 1 at 4 ranks, else 2)
  nlohmann::json model = nlohmann::json::object();  // replaces the gpt2-tiny model block
  int expert_parallel = 0;  // expert_parallel.autoep_size (0: no expert_parallel block)
  nlohmann::json zero_extra = nlohmann::json::object();  // more zero_optimization keys
  int keep_last = 0;                                     // checkpoint.keep_last
  double fp16_loss_scale = 0.0;                          // fp16.loss_scale (0: dynamic)
  std::string data;           // data.train (empty: the shared corpus, <root>/t_train_*.bin)
  std::string on_save_error;  // checkpoint.on_save_error (empty: the default, "stop")
  int sample_tokens = 0;      // train.sample_tokens
};

std::string shell(const std::string& cmd, int* status) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  const int rc = pclose(pipe);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  return out;
}

// Runs zrt-train for `job` as <root>/<name>; returns its exit status and output.
int launch(const std::string& name, const Job& job, std::string* output = nullptr) {
  const fs::path out = root() / name;
  if (!job.keep_output) fs::remove_all(out);
  fs::create_directories(out);
  // A fixed global batch of 12 sequences at any world size: micro-batches of 12 / (N * G).
  const int G = job.accumulation > 0 ? job.accumulation : job.ranks == 4 ? 1 : 2;
  const int micro = 12 / (job.ranks * G);
  nlohmann::json c = {
      {"train_batch_size", 12},
      {"train_micro_batch_size_per_gpu", micro},
      {"gradient_accumulation_steps", G},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.002}, {"weight_decay", 0.1}}}}},
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}, {"warmup_max_lr", 0.002}}}}},
      {"zero_optimization", {{"stage", job.stage}, {"reduce_bucket_size", 20000}}},
      {"model", {{"preset", "gpt2-tiny"}, {"seq_len", 32}}},
      {"data",
       {{"train", job.data.empty() ? (root() / "t_train_*.bin").string() : job.data},
        {"shuffle", true}}},
      {"train", {{"steps", job.steps}, {"log_interval", 1}}},
      {"device", {{"type", "cpu"}}},
      {"output_dir", out.string()},
  };
  if (job.sample_tokens > 0) c["train"]["sample_tokens"] = job.sample_tokens;
  if (job.lion) {
    c["optimizer"] = {{"type", "Lion"}, {"params", {{"lr", 2e-4}, {"weight_decay", 1.0}}}};
    c["scheduler"]["params"]["warmup_max_lr"] = 2e-4;
  }
  if (job.stage == 3) c["zero_optimization"]["stage3_param_persistence_threshold"] = 100;
  if (job.offload) c["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  c["zero_optimization"].update(job.zero_extra);
  if (job.ranks_per_node > 0) c["comm"] = {{"ranks_per_node", job.ranks_per_node}};
  if (!job.model.empty()) c["model"] = job.model;
  if (job.expert_parallel > 0) {
    c["expert_parallel"] = {{"enabled", true}, {"autoep_size", job.expert_parallel}};
  }
  if (job.bf16) c["bf16"] = {{"enabled", true}};
  if (job.fp16) c["fp16"] = {{"enabled", true}, {"loss_scale", job.fp16_loss_scale}};
  nlohmann::json k = {{"save_interval", job.save_interval}, {"async", job.async}};
  if (job.keep_last > 0) k["keep_last"] = job.keep_last;
  k["save_dir"] = job.save_dir.empty() ? (out / "ckpt").string() : job.save_dir;
  if (!job.load.empty()) k["load"] = job.load;
  if (job.overwrite) k["overwrite"] = true;
  if (!job.on_save_error.empty()) k["on_save_error"] = job.on_save_error;
  c["checkpoint"] = k;
  std::ofstream(out / "run.json") << c.dump(2);
  const std::string cmd = job.env + " " + ZRT_MPIEXEC + " -n " + std::to_string(job.ranks) +
                          " --oversubscribe --bind-to none " + ZRT_TRAIN + " --config " +
                          (out / "run.json").string();
  int status = 0;
  const std::string text = shell(cmd, &status);
  std::ofstream(out / "log.txt") << text;
  if (output != nullptr) *output = text;
  return status;
}

void run_ok(const std::string& name, const Job& job) {
  std::string text;
  const int status = launch(name, job, &text);
  INFO(name << ":\n" << text);
  REQUIRE(status == 0);
}

// Training losses by step from a run's metrics.jsonl.
std::map<std::int64_t, double> losses(const std::string& name) {
  return test::metrics_losses(root() / name / "metrics.jsonl");
}

// Per-tensor relative error of two checkpoints' full parameters. The key third of
// attn.c_attn.bias is left out: softmax is invariant to a per-query constant, so its true
// gradient is identically zero and it holds only rounding noise (a norm of ~3e-6 after a few
// steps), which Adam turns into steps of the full learning rate; two uninterrupted runs at
// different world sizes differ there by the same ~50%. Its absolute difference is bounded
// instead (*key_bias_diff).
double max_relative_error(const std::string& a, const std::string& b, double* key_bias_diff,
                          std::string* worst_name) {
  const auto ia = open_index(a);
  const auto ib = open_index(b);
  const auto pa = read_full_params(a, ia);
  const auto pb = read_full_params(b, ib);
  REQUIRE(pa.size() == pb.size());
  double worst = 0.0;
  *key_bias_diff = 0.0;
  for (std::size_t p = 0; p < pa.size(); ++p) {
    const std::string& name = ia.params[p].name;
    const bool qkv_bias =
        name.size() > 16 && name.compare(name.size() - 16, 16, "attn.c_attn.bias") == 0;
    const std::size_t C = pa[p].size() / 3;
    double diff = 0.0, norm = 0.0, key = 0.0;
    for (std::size_t e = 0; e < pa[p].size(); ++e) {
      const double d = static_cast<double>(pa[p][e]) - pb[p][e];
      if (qkv_bias && e >= C && e < 2 * C) {
        key += d * d;
        continue;
      }
      diff += d * d;
      norm += static_cast<double>(pb[p][e]) * pb[p][e];
    }
    *key_bias_diff = std::max(*key_bias_diff, std::sqrt(key));
    const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
    if (rel > worst) {
      worst = rel;
      *worst_name = name;
    }
  }
  return worst;
}

// K = 3 steps, save; a new job loads `latest` and runs to 2K; against 2K in one job.
void bit_exact_case(const std::string& name, Job job) {
  const std::string whole = name + "_whole";
  const std::string first = name + "_first";
  const std::string second = name + "_second";
  Job j = job;
  j.steps = 6;
  j.save_interval = 6;
  run_ok(whole, j);
  j.steps = 3;
  j.save_interval = 3;
  j.save_dir = (root() / (name + "_ckpt")).string();
  fs::remove_all(j.save_dir);
  run_ok(first, j);
  j.steps = 6;
  j.load = "latest";
  run_ok(second, j);
  const auto a = losses(whole);
  const auto b = losses(first);
  const auto c = losses(second);
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 3);
  REQUIRE(c.size() == 3);
  for (std::int64_t s = 1; s <= 6; ++s) {
    INFO("step " << s);
    CHECK(a.at(s) == (s <= 3 ? b.at(s) : c.at(s)));  // bit for bit
  }
  require_identical_state(latest_dir((root() / whole / "ckpt").string()), latest_dir(j.save_dir));
}

// How the resume's log line describes a job's layout (docs/checkpoints.md).
std::string layout_text(const Job& j) {
  std::string text = std::to_string(j.ranks) + (j.ranks == 1 ? " rank" : " ranks") +
                     " at ZeRO stage " + std::to_string(j.stage);
  if (j.expert_parallel > 1) {
    text += ", expert_parallel.autoep_size " + std::to_string(j.expert_parallel);
  }
  return text;
}

// K steps at `from`, then 2K at `to` from its checkpoint; against 2K at `to` in one job.
void reshard_case(const std::string& name, Job from, Job to) {
  from.steps = 3;
  from.save_interval = 3;
  from.save_dir = (root() / (name + "_ckpt")).string();
  fs::remove_all(from.save_dir);
  run_ok(name + "_first", from);
  Job resumed = to;
  resumed.steps = 6;
  resumed.save_interval = 6;
  resumed.save_dir = from.save_dir;
  resumed.load = "latest";
  std::string text;
  const int status = launch(name + "_second", resumed, &text);
  INFO(text);
  REQUIRE(status == 0);
  CHECK_THAT(text, Catch::Contains("resumed from") && Catch::Contains("global_step3"));
  // The log names both layouts.
  CHECK_THAT(text, Catch::Contains("at step 3 (saved by " + layout_text(from) + ", resharded for " +
                                   layout_text(to) + ")"));
  to.steps = 6;
  to.save_interval = 6;
  run_ok(name + "_whole", to);
  const auto a = losses(name + "_whole");
  const auto c = losses(name + "_second");
  REQUIRE(c.size() == 3);
  for (std::int64_t s = 4; s <= 6; ++s) {
    INFO("step " << s);
    CHECK(c.at(s) == Approx(a.at(s)).epsilon(1e-5));
  }
  double key_bias = 0.0;
  std::string worst;
  const double err = max_relative_error(latest_dir(from.save_dir),
                                        latest_dir((root() / (name + "_whole") / "ckpt").string()),
                                        &key_bias, &worst);
  INFO(name << ": worst per-tensor relative error " << err << " (" << worst
            << "); key-bias difference " << key_bias);
  CHECK(err <= 1e-5);
  CHECK(key_bias <= 1e-5);
}

}  // namespace

TEST_CASE("resume at the same world size and stage is bit-exact", "[resume]") {
  Job stage1;
  stage1.stage = 1;
  stage1.async = true;  // the async writer's files are the ones compared
  // The state copy is held back on its stream, so each step after a save must wait for it.
  stage1.env = "ZRT_TEST_CKPT_COPY_DELAY_MS=200";
  bit_exact_case("exact_s1", stage1);
  Job stage3;
  stage3.stage = 3;
  stage3.offload = true;
  stage3.bf16 = true;
  stage3.async = true;  // the copy runs on the CPU optimizer's thread
  stage3.env = "ZRT_TEST_CKPT_COPY_DELAY_MS=200";
  bit_exact_case("exact_s3_offload_bf16", stage3);
  // Partial offload: half the state on the device (copied on its stream), half on the host
  // (copied by the CPU optimizer's thread), one checkpoint.
  Job split = stage3;
  split.zero_extra = {{"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}};
  bit_exact_case("exact_s3_split_bf16", split);
}

TEST_CASE("a checkpoint of a partial offload resumes under full offload, bit for bit",
          "[resume][ratio]") {
  // The file does not say where the state lived: steps 4-6 under full offload from a split
  // run's step-3 checkpoint are those of a full-offload run from the start (the CPU backend's
  // device and host optimizers are one kernel).
  Job split;
  split.stage = 3;
  split.offload = true;
  split.zero_extra = {{"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.4}}}};
  split.steps = 3;
  split.save_interval = 3;
  split.save_dir = (root() / "split_to_full_ckpt").string();
  fs::remove_all(split.save_dir);
  run_ok("split_to_full_first", split);
  Job full;
  full.stage = 3;
  full.offload = true;
  full.steps = 6;
  full.save_interval = 6;
  run_ok("split_to_full_whole", full);
  full.save_dir = split.save_dir;
  full.load = "latest";
  run_ok("split_to_full_second", full);
  const auto a = losses("split_to_full_whole");
  const auto b = losses("split_to_full_first");
  const auto c = losses("split_to_full_second");
  REQUIRE(b.size() == 3);
  REQUIRE(c.size() == 3);
  for (std::int64_t s = 1; s <= 6; ++s) {
    INFO("step " << s);
    CHECK(a.at(s) == (s <= 3 ? b.at(s) : c.at(s)));
  }
  require_identical_state(latest_dir((root() / "split_to_full_whole" / "ckpt").string()),
                          latest_dir(full.save_dir));
}

TEST_CASE("Lion: resume is bit-exact; its checkpoint is not Adam's", "[resume][lion]") {
  Job lion;
  lion.lion = true;
  lion.stage = 3;
  lion.offload = true;  // the CPU Lion steps the offloaded state
  lion.async = true;
  lion.env = "ZRT_TEST_CKPT_COPY_DELAY_MS=200";
  bit_exact_case("exact_lion_s3_offload", lion);
  const CheckpointIndex index =
      open_index(latest_dir((root() / "exact_lion_s3_offload_ckpt").string()));
  CHECK(index.optimizer == "Lion");
  CHECK(index.state_datasets() == std::vector<std::string>{"/master", "/exp_avg"});
  // The same checkpoint loaded by an AdamW run: an error naming both optimizers, before training.
  Job adam;
  adam.stage = 3;
  adam.steps = 6;
  adam.save_dir = (root() / "exact_lion_s3_offload_ckpt").string();
  adam.load = "latest";
  std::string text;
  const int status = launch("lion_into_adam", adam, &text);
  INFO(text);
  CHECK(status != 0);
  CHECK_THAT(text, Catch::Contains("the checkpoint holds the state of optimizer Lion (state "
                                   "exp_avg), but this run uses optimizer Adam (state exp_avg "
                                   "exp_avg_sq)"));
}

TEST_CASE("zrt-train with hpZ at 4 ranks as 2 nodes x 2 trains as plain stage 3, bit for bit",
          "[hpz]") {
  // hpZ changes where the backward's gathers read the parameters from (each node's secondary
  // shards instead of every rank), not what they gather: the losses and the final state must be
  // plain stage 3's exactly, while fewer bytes cross nodes.
  for (const bool offload : {false, true}) {
    INFO("optimizer offload " << offload);
    Job plain;
    plain.ranks = 4;
    plain.stage = 3;
    plain.bf16 = true;
    plain.offload = offload;
    plain.ranks_per_node = 2;
    plain.save_interval = plain.steps;
    Job hpz = plain;
    hpz.zero_extra = {{"zero_hpz_partition_size", 2}};
    const std::string suffix = offload ? "_offload" : "";
    run_ok("hpz_plain" + suffix, plain);
    run_ok("hpz_on" + suffix, hpz);
    const auto a = losses("hpz_plain" + suffix);
    const auto b = losses("hpz_on" + suffix);
    REQUIRE(a.size() == 6);
    CHECK(a == b);  // bit for bit
    require_identical_state(latest_dir((root() / ("hpz_plain" + suffix) / "ckpt").string()),
                            latest_dir((root() / ("hpz_on" + suffix) / "ckpt").string()));
    // hpZ was at work: every step sent fewer bytes to the other node.
    auto inter_bytes = [](const std::string& name) {
      std::vector<std::int64_t> out;
      std::ifstream in(root() / name / "metrics.jsonl");
      for (std::string line; std::getline(in, line);) {
        const auto row = nlohmann::json::parse(line);
        if (row.contains("comm_inter_node_bytes")) {
          out.push_back(row["comm_inter_node_bytes"].get<std::int64_t>());
        }
      }
      return out;
    };
    const auto plain_bytes = inter_bytes("hpz_plain" + suffix);
    const auto hpz_bytes = inter_bytes("hpz_on" + suffix);
    REQUIRE(plain_bytes.size() == 6);
    REQUIRE(hpz_bytes.size() == 6);
    for (std::size_t s = 0; s < 6; ++s) {
      INFO("step " << s + 1);
      CHECK(hpz_bytes[s] < plain_bytes[s]);
    }
  }
}

TEST_CASE("resume at another world size or stage", "[reshard]") {
  auto job = [](int ranks, int stage) {
    Job j;
    j.ranks = ranks;
    j.stage = stage;
    return j;
  };
  reshard_case("n4_to_n2", job(4, 2), job(2, 2));
  reshard_case("n2_to_n3", job(2, 2), job(3, 2));
  reshard_case("n3_to_n4", job(3, 2), job(4, 2));
  reshard_case("s2_to_s3", job(2, 2), job(2, 3));
  reshard_case("s3_to_s1", job(2, 3), job(2, 1));
}

TEST_CASE("a mixture of experts resumes at another expert-parallel degree and world size",
          "[reshard][moe]") {
  // Qwen3-MoE (tiny) with its experts split over autoep_size ranks: each rank's experts are
  // parameters of their own (group 1, named by the global expert), stacked in one parameter per
  // layer without expert parallelism; the checkpoint finds them by name either way. Three
  // sequences per forward at every layout (the load-balancing term is per forward), so the
  // uninterrupted run at the new layout is the reference.
  auto job = [](int ranks, int ep) {
    Job j;
    j.ranks = ranks;
    j.stage = 2;
    j.accumulation = 4 / ranks;
    j.model = {
        {"type", "qwen3_moe"}, {"preset", "qwen3-moe-tiny"}, {"seq_len", 32}, {"vocab_size", 256}};
    j.expert_parallel = ep;
    return j;
  };
  reshard_case("moe_ep4_to_ep2", job(4, 4), job(2, 2));
  {
    // zrt-ckpt inspect's rank files: each rank is its own expert-parallel position (autoep_size
    // equals the world), so rank r holds experts E/ep r .. E/ep (r + 1) - 1 of the 8 (and only
    // it: the expert-data-parallel group has one rank): 2 per rank in the step-3 checkpoint
    // (4 ranks), 4 in the step-6 one the resumed run saved (2 ranks).
    for (const auto& [tag, per_rank] :
         {std::pair{"global_step3", 2}, std::pair{"global_step6", 4}}) {
      int status = 0;
      const std::string text = shell(
          std::string(ZRT_CKPT) + " inspect " + (root() / "moe_ep4_to_ep2_ckpt" / tag).string(),
          &status);
      INFO(text);
      REQUIRE(status == 0);
      for (int layer = 0; layer < 2; ++layer) {
        for (int e = 0; e < 8; ++e) {
          const std::string name = "model.layers." + std::to_string(layer) + ".mlp.experts." +
                                   std::to_string(e) + ".down_proj";
          const std::size_t at = text.find(name + " ");
          REQUIRE(at != std::string::npos);
          const std::string line = text.substr(at, text.find('\n', at) - at);
          INFO(line);
          CHECK_THAT(line, Catch::EndsWith("  " + std::to_string(e / per_rank)));
        }
      }
      // The dense unit (12096 elements, the embedding its last 4096 from offset 8000) is in
      // one slice per rank: 3024 each at 4 ranks, so the embedding spans slices 2 and 3; 6048
      // at 2, so it lies in slice 1.
      const std::size_t at = text.find("model.embed_tokens.weight ");
      REQUIRE(at != std::string::npos);
      CHECK_THAT(text.substr(at, text.find('\n', at) - at),
                 Catch::EndsWith(per_rank == 2 ? "  2-3" : "  1"));
    }
  }
  reshard_case("moe_ep2_to_ep1", job(2, 2), job(1, 0));
  reshard_case("moe_ep1_to_ep4", job(1, 0), job(4, 4));
  // MiCS (shard groups of 2) at autoep_size 2: the experts' slices are kept by their
  // expert-data-parallel ranks in a shard group (one here: a whole copy, written once by the
  // first of its replicas) and found by name at one rank, and the other way.
  Job mics = job(4, 2);
  mics.zero_extra = {{"mics_shard_size", 2}};
  reshard_case("moe_ep2_mics2_to_ep1", mics, job(1, 0));
  reshard_case("moe_ep1_to_ep2_mics2", job(1, 0), mics);
  // Stage 0 at autoep_size 2: the experts whole on every rank of their expert-data-parallel
  // group, written once by its first rank, the dense units by rank 0; to stage 2 at 2 ranks
  // without expert parallelism, and from it.
  Job stage0 = job(4, 2);
  stage0.stage = 0;
  Job two = job(2, 0);
  reshard_case("moe_ep2_s0_to_s2", stage0, two);
  reshard_case("moe_s2_to_ep2_s0", two, stage0);
}

TEST_CASE("a rank killed during a save leaves the previous checkpoint loadable", "[kill]") {
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  j.save_dir = (root() / "kill_ckpt").string();
  fs::remove_all(j.save_dir);
  run_ok("kill_first", j);
  j.steps = 4;
  j.load = "latest";
  j.env = "ZRT_TEST_CKPT_KILL_RANK=1";
  std::string text;
  CHECK(launch("kill_second", j, &text) != 0);
  INFO(text);
  CHECK(*read_latest(j.save_dir) == "global_step2");
  CHECK(fs::exists(fs::path(j.save_dir) / "global_step4.tmp"));
  CHECK_FALSE(fs::exists(fs::path(j.save_dir) / "global_step4"));
  j.env = "";
  text.clear();
  REQUIRE(launch("kill_third", j, &text) == 0);
  CHECK_THAT(text, Catch::Contains("resumed from " + j.save_dir +
                                   "/global_step2 at step 2 (saved by 2 ranks at ZeRO stage 2)"));
  CHECK(*read_latest(j.save_dir) == "global_step4");
  CHECK_FALSE(fs::exists(fs::path(j.save_dir) / "global_step4.tmp"));
  CHECK(verify_checkpoint(latest_dir(j.save_dir)) > 0);
}

TEST_CASE("a save directory one rank cannot see fails the save, naming it", "[sharedfs]") {
  Job j;
  j.steps = 1;
  j.save_interval = 1;
  j.save_dir = (root() / "probe_ckpt").string();
  fs::remove_all(j.save_dir);
  j.env = "ZRT_TEST_CKPT_PROBE_RANK=1";
  std::string text;
  CHECK(launch("probe", j, &text) != 0);
  CHECK_THAT(text, Catch::Contains("checkpoint.save_dir '" + j.save_dir +
                                   "' is not shared: rank 1 cannot see"));
  CHECK_THAT(text, Catch::Contains("needs a shared file system"));
  CHECK_FALSE(read_latest(j.save_dir).has_value());
}

// Every save draws an id written into its index and each of its rank files: a rank file copied
// in from another checkpoint of the same run (same shapes, same rank and world, valid checksums)
// is refused by the resume, zrt-ckpt verify and consolidate, naming the file; before, it loaded
// silently (step 2's weights with step 4's counters) and verify said OK. A rank file in another
// rank's place is refused by consolidate too (it checked only the format).
TEST_CASE("a rank file from another save, or another rank's, is refused on every read",
          "[save-id]") {
  Job j;
  j.steps = 4;
  j.save_interval = 2;
  j.save_dir = (root() / "save_id_ckpt").string();
  fs::remove_all(j.save_dir);
  run_ok("save_id", j);
  const fs::path step2 = fs::path(j.save_dir) / "global_step2";
  const fs::path step4 = fs::path(j.save_dir) / "global_step4";
  REQUIRE(open_index(step2.string()).save_id != 0);
  CHECK(open_index(step2.string()).save_id != open_index(step4.string()).save_id);
  CHECK(verify_checkpoint(step4.string()) > 0);
  fs::copy_file(step2 / rank_file_name(1), step4 / rank_file_name(1),
                fs::copy_options::overwrite_existing);
  const std::string tool = ZRT_CKPT;
  const std::string message =
      (step4 / rank_file_name(1)).string() + ": written by another save than the index next to it";
  int status = 0;
  std::string out = shell(tool + " verify " + step4.string(), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Catch::Contains(message));
  out = shell(tool + " consolidate " + step4.string() + " --out " +
                  (root() / "save_id" / "mixed.h5").string(),
              &status);
  CHECK(status != 0);
  CHECK_THAT(out, Catch::Contains(message));
  Job resume = j;
  resume.steps = 6;
  resume.keep_output = true;
  std::string text;
  CHECK(launch("save_id", resume, &text) != 0);
  CHECK_THAT(text, Catch::Contains(message));

  // Rank files swapped within one save: consolidate refuses, as the resume and verify do.
  const fs::path r0 = step2 / rank_file_name(0), r1 = step2 / rank_file_name(1);
  fs::rename(r0, step2 / "swap.h5");
  fs::rename(r1, r0);
  fs::rename(step2 / "swap.h5", r1);
  out = shell(tool + " consolidate " + step2.string() + " --out " +
                  (root() / "save_id" / "swapped.h5").string(),
              &status);
  CHECK(status != 0);
  CHECK_THAT(out, Catch::Contains(r0.string() + ": holds rank 1 of 2, the index expects rank 0"));
}

// Resuming from an older tag starts another timeline: keep_last counts this run's checkpoints
// (up to the one it saves) and leaves the other timeline's later ones alone, and the resume says
// so. Before, pruning sorted by step, so the abandoned run's global_step8 outlived the new run's
// global_step4 and the new run had one fallback instead of two.
TEST_CASE("keep_last after a resume from an older tag keeps this run's newest", "[keep-last]") {
  Job j;
  j.steps = 8;
  j.save_interval = 2;
  j.save_dir = (root() / "keep_ckpt").string();
  fs::remove_all(j.save_dir);
  run_ok("keep", j);
  Job again = j;
  again.steps = 6;
  again.load = "global_step2";
  again.keep_last = 2;
  again.keep_output = true;
  std::string text;
  REQUIRE(launch("keep", again, &text) == 0);
  CHECK_THAT(text, Catch::Contains("3 checkpoint(s) past the resumed step 2 (global_step4, "
                                   "global_step6, global_step8) are another run's timeline"));
  // metrics.jsonl's rows past step 2 go, and the log says why (not "a run that did not reach a
  // later checkpoint").
  CHECK_THAT(text, Catch::Contains("kept 2 row(s) up to step 2, dropped 6 written after it (the "
                                   "run resumed from an older checkpoint than the newest"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(j.save_dir)) {
    if (e.is_directory()) left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"global_step4", "global_step6", "global_step8"});
  CHECK(read_latest(j.save_dir) == std::optional<std::string>("global_step6"));
  // global_step4 and 6 are this run's: saved after the resume, so their step counts say 4, 6
  // of a run that started from 2 (their ids differ from the first run's, which they replaced).
  CHECK(open_index((fs::path(j.save_dir) / "global_step6").string()).step == 6);
}

// fp16 with a static loss scale resumed from a dynamically scaled checkpoint scales by the
// config's value (it kept the saved 65536 for the rest of the run, silently).
TEST_CASE("a static fp16 loss scale in the resuming config applies", "[fp16-resume]") {
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  j.fp16 = true;
  j.save_dir = (root() / "fp16_scale_ckpt").string();
  fs::remove_all(j.save_dir);
  run_ok("fp16_scale", j);
  Job fixed = j;
  fixed.steps = 4;
  fixed.fp16_loss_scale = 128;
  fixed.keep_output = true;
  std::string text;
  REQUIRE(launch("fp16_scale", fixed, &text) == 0);
  CHECK_THAT(text, Catch::Contains("the config's static fp16.loss_scale 128 applies"));
  std::ifstream in(root() / "fp16_scale" / "metrics.jsonl");
  std::string line;
  int resumed_rows = 0;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss_scale") || row["step"].get<int>() <= 2) continue;
    ++resumed_rows;
    CHECK(row["loss_scale"].get<double>() == 128.0);
  }
  CHECK(resumed_rows == 2);
}

// Rank 0 decides what to resume from and every rank takes it; a rank that cannot see the
// checkpoint (here, by the test hook, one that looks in another directory) stops every rank
// before anything is loaded, naming itself and the directory.
TEST_CASE("a resume that one rank cannot see stops every rank, naming it", "[sharedfs]") {
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  j.save_dir = (root() / "blind_ckpt").string();
  fs::remove_all(j.save_dir);
  run_ok("blind", j);
  Job again = j;
  again.steps = 4;
  again.keep_output = true;
  again.env = "ZRT_TEST_CKPT_PROBE_RANK=1";
  std::string text;
  CHECK(launch("blind", again, &text) != 0);
  CHECK_THAT(text, Catch::Contains("checkpoint " + j.save_dir +
                                   "/global_step2 (rank 0 resumes "
                                   "from it): rank 1 cannot see its index.h5"));
}

// A model key that changes no shape (2 heads of 32 instead of 4 of 16) passes the load's shape
// checks; the resume names it with both values (it said nothing).
TEST_CASE("a resume under a changed model block names the changed keys", "[model-change]") {
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  j.save_dir = (root() / "model_change_ckpt").string();
  fs::remove_all(j.save_dir);
  run_ok("model_change", j);
  Job again = j;
  again.steps = 3;
  again.keep_output = true;
  again.model = {{"preset", "gpt2-tiny"}, {"seq_len", 32}, {"n_head", 2}};
  std::string text;
  REQUIRE(launch("model_change", again, &text) == 0);
  CHECK_THAT(text, Catch::Contains("the model block differs from the one this checkpoint was "
                                   "saved with (model.n_head (unset) -> 2)"));
  // The same data files: no word of them.
  CHECK_THAT(text, !Catch::Contains("is not the data this checkpoint was saved with"));
}

// A resume over other files with the same sample count (a shard regenerated with other tokens
// of the same length) passes the stream's restore, which compares counts; the fingerprint saved
// with the checkpoint names the changed file.
TEST_CASE("a resume over other data of the same size names the changed file", "[data-change]") {
  const fs::path data = root() / "data_change_files";
  fs::remove_all(data);
  fs::create_directories(data);
  auto write_data = [&](const std::string& sentence) {
    std::string text;
    while (text.size() < 20000) text += sentence;
    text.resize(20000);
    std::vector<std::uint16_t> tokens(text.begin(), text.end());
    write_shard((data / "d_train_000000.bin").string(), tokens.data(), tokens.size());
  };
  write_data("In the beginning was the Word, and the Word was God. ");
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  j.data = (data / "d_train_*.bin").string();
  j.save_dir = (root() / "data_change_ckpt").string();
  fs::remove_all(j.save_dir);
  run_ok("data_change", j);
  write_data("All the world's a stage, and all the men and women merely players. ");
  Job again = j;
  again.steps = 3;
  again.keep_output = true;
  std::string text;
  REQUIRE(launch("data_change", again, &text) == 0);
  CHECK_THAT(text, Catch::Contains("is not the data this checkpoint was saved with: "
                                   "d_train_000000.bin has other contents (same size)"));
}

// A second job into a save_dir a running job saves to is refused at its start (here the
// running job is this test process holding the directory's lock).
TEST_CASE("a job into a save_dir another running job holds is refused", "[save-dir-lock]") {
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  j.save_dir = (root() / "locked_ckpt").string();
  fs::remove_all(j.save_dir);
  std::string text;
  {
    const SaveDirLock held(j.save_dir);
    CHECK(launch("locked", j, &text) != 0);
    CHECK_THAT(text, Catch::Contains("checkpoint.save_dir " + j.save_dir +
                                     " is in use by another running job"));
    CHECK_FALSE(read_latest(j.save_dir).has_value());
  }
  run_ok("locked", j);  // released: the directory is free
  CHECK(read_latest(j.save_dir) == std::optional<std::string>("global_step2"));
}

TEST_CASE("a failed async save is logged at once and fails the run", "[async-fail]") {
  Job j;
  j.steps = 3;
  j.save_interval = 1;
  j.async = true;
  // The writer thread fails on rank 1 (a save_dir that cannot be written is refused at the
  // start now, so the failure is injected where the files are written).
  j.env = "ZRT_FAULT_INJECT=throw:point=checkpoint.write:rank=1:step=1";
  std::string text;
  CHECK(launch("async_fail", j, &text) != 0);
  INFO(text);
  // The writer thread's own report (tag, reason); the run then stops at the next save.
  CHECK_THAT(text, Catch::Contains("checkpoint global_step1: async save failed: "));
  CHECK_THAT(text, Catch::Contains("fault injected at checkpoint.write (rank 1, step 1)"));
  const fs::path save_dir = root() / "async_fail" / "ckpt";
  REQUIRE(fs::is_directory(save_dir));  // the run's own save_dir, which it did make
  CHECK_FALSE(read_latest(save_dir.string()).has_value());
}

// checkpoint.on_save_error "continue": a failed save is logged and training goes on; the run
// ends in an error only when the state it ended with is in no checkpoint (the last save
// failed), whatever `latest` held before, sync or async.
TEST_CASE("on_save_error continue: only a failed last save fails the run", "[async-fail]") {
  for (const bool async : {false, true}) {
    for (const int failing : {2, 3}) {
      Job j;
      j.steps = 3;
      j.save_interval = 1;
      j.async = async;
      j.on_save_error = "continue";
      j.sample_tokens = 8;
      j.env =
          "ZRT_FAULT_INJECT=throw:point=checkpoint.write:rank=1:step=" + std::to_string(failing);
      const std::string name =
          std::string("continue_") + (async ? "async_" : "sync_") + std::to_string(failing);
      std::string text;
      const int status = launch(name, j, &text);
      INFO(name << ":\n" << text);
      CHECK(losses(name).size() == 3);  // every step trained
      const auto latest = read_latest((root() / name / "ckpt").string());
      if (failing == 2) {
        CHECK(status == 0);
        CHECK_THAT(text, Catch::Contains("training goes on (checkpoint.on_save_error "
                                         "\"continue\"), latest is global_step1"));
        CHECK_THAT(text, !Catch::Contains("no checkpoint holds it"));
        CHECK(latest == std::optional<std::string>("global_step3"));
      } else {
        CHECK(status == 1);
        CHECK_THAT(text, Catch::Contains("that was the run's last step"));
        CHECK_THAT(text, Catch::Contains("training reached step 3, but no checkpoint holds it: "
                                         "1 save(s) failed"));
        CHECK(latest == std::optional<std::string>("global_step2"));
      }
      // The model trained every step either way: the demo sample is drawn.
      CHECK_THAT(text, Catch::Contains("sample: "));
    }
  }
}

// Every rank writes its part of a checkpoint into save_dir: one rank that cannot (a node
// whose mount is read-only) is named at the start, before any step is trained.
TEST_CASE("a save_dir one rank cannot write is refused before training, naming the rank",
          "[async-fail]") {
  Job j;
  j.steps = 2;
  j.save_interval = 1;
  j.env = "ZRT_TEST_CKPT_UNWRITABLE_RANK=1";
  std::string text;
  CHECK(launch("unwritable_rank", j, &text) != 0);
  {
    INFO(text);
    const std::string save_dir = (root() / "unwritable_rank" / "ckpt").string();
    CHECK_THAT(text,
               Catch::Contains("checkpoint.save_dir " + save_dir +
                               " cannot be written (rank 1: " + save_dir + "/.write-probe-") &&
                   Catch::Contains("Permission denied; the run's user may not write there"));
    CHECK(losses("unwritable_rank").empty());
    // Rank 0's probe left nothing behind.
    for (const auto& e : fs::directory_iterator(save_dir)) {
      CHECK(e.path().filename().string().rfind(".write-probe-", 0) != 0);
    }
  }
  // "continue": warned of, and trained (here the saves themselves succeed).
  j.on_save_error = "continue";
  text.clear();
  CHECK(launch("unwritable_rank", j, &text) == 0);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("cannot be written (rank 1: ") &&
                       Catch::Contains("every save will fail and be logged"));
  CHECK(losses("unwritable_rank").size() == 2);
}

TEST_CASE("a save_dir that cannot be written is refused before training", "[async-fail]") {
  Job j;
  j.steps = 3;
  j.save_interval = 1;
  const fs::path blocker = root() / "unwritable_blocker";
  std::ofstream(blocker) << "a file, not a directory";
  j.save_dir = (blocker / "ckpt").string();
  std::string text;
  CHECK(launch("unwritable", j, &text) != 0);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("checkpoint.save_dir " + j.save_dir + " cannot be written (") &&
                       Catch::Contains("Not a directory"));
  CHECK(losses("unwritable").empty());  // no step trained
}

TEST_CASE("zrt-ckpt inspect, verify, consolidate, export", "[zrt-ckpt]") {
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  j.stage = 3;
  j.ranks = 3;
  run_ok("tool", j);
  const std::string save_dir = (root() / "tool" / "ckpt").string();
  const std::string dir = latest_dir(save_dir);
  const std::string tool = ZRT_CKPT;
  int status = 0;
  const std::string inspect = shell(tool + " inspect " + save_dir, &status);
  CHECK(status == 0);
  CHECK_THAT(inspect, Catch::Contains("step         2 (optimizer steps 2, skipped 0)"));
  CHECK_THAT(inspect, Catch::Contains("world        3 rank file(s), ZeRO stage 3"));
  CHECK_THAT(inspect, Catch::Contains("transformer.h.0.attn.c_attn.weight"));
  CHECK_THAT(inspect, Catch::Contains("(64, 192)"));
  CHECK_THAT(inspect, !Catch::Contains("loss scale"));  // an fp32 run scales nothing
  const std::string verify = shell(tool + " verify " + dir, &status);
  CHECK(status == 0);
  CHECK_THAT(verify, Catch::Contains("OK"));
  // The save_dir's `latest` file names the same checkpoint as the save_dir.
  CHECK(shell(tool + " inspect " + save_dir + "/latest", &status) == inspect);
  CHECK(status == 0);
  // ... also through a symbolic link elsewhere: the tags are beside the file it links to.
  const fs::path link = root() / "tool" / "elsewhere" / "latest";
  fs::remove_all(link.parent_path());
  fs::create_directories(link.parent_path());
  fs::create_symlink(fs::path(save_dir) / "latest", link);
  CHECK(shell(tool + " inspect " + link.string(), &status) == inspect);
  CHECK(status == 0);
  // An option without its value is bad usage, named as such.
  CHECK_THAT(shell(tool + " consolidate " + dir + " --out", &status),
             Catch::Contains("zrt-ckpt: --out needs a value"));
  CHECK(status == 2);
  // A save that never committed (its .tmp directory) is read with a warning.
  const fs::path uncommitted = root() / "tool" / "global_step2.tmp";
  fs::remove_all(uncommitted);
  fs::copy(dir, uncommitted);
  CHECK_THAT(shell(tool + " inspect " + uncommitted.string(), &status),
             Catch::Contains("is a save that never committed (a .tmp directory)"));
  CHECK(status == 0);

  const auto index = open_index(dir);
  const auto full = read_full_params(dir, index);
  const std::string h5 = (root() / "tool" / "model.h5").string();
  shell(tool + " consolidate " + dir + " --out " + h5, &status);
  REQUIRE(status == 0);
  {
    const H5File f = H5File::open_read(h5);
    for (std::size_t p = 0; p < index.params.size(); ++p) {
      std::vector<float> v(full[p].size());
      H5Dataset(f, "/params/" + index.params[p].name, H5Elem::kFloat32, index.params[p].shape)
          .read_all(v.data());
      INFO(index.params[p].name);
      CHECK(v == full[p]);
    }
  }
  // The output folder does not exist yet: export creates it.
  const std::string st = (root() / "tool" / "export" / "model.safetensors").string();
  fs::remove_all(fs::path(st).parent_path());
  const std::string exported = shell(tool + " export " + dir + " --safetensors " + st, &status);
  INFO(exported);
  REQUIRE(status == 0);
  // model.init_from's reader takes it, with the saved values.
  const gpt::GptConfig cfg = gpt::GptConfig::parse("gpt2-tiny:seq_len=32");
  std::vector<ParamSpec> params;
  for (const auto& e : index.params) params.push_back(ParamSpec{e.name, e.shape, {0}, false});
  const gpt::GptWeights weights(st, params);
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(full[p].size());
    weights.read(static_cast<int>(p), 0, static_cast<std::int64_t>(v.size()), v.data());
    CHECK(v == full[p]);
  }
  CHECK(cfg.n_layer == 2);
  const auto hf = nlohmann::json::parse(std::ifstream(fs::path(st).parent_path() / "config.json"));
  CHECK(hf["n_head"] == 4);
  CHECK(hf["n_layer"] == 2);
  CHECK(hf["n_positions"] == 32);
  CHECK(hf["vocab_size"] == 256);
  CHECK(hf["model_type"] == "gpt2");
  // A 256-token vocabulary has no id 50256, GPT2Config's default bos/eos: null, not left out.
  CHECK(hf.contains("bos_token_id"));
  CHECK(hf["bos_token_id"].is_null());
  CHECK(hf.contains("eos_token_id"));
  CHECK(hf["eos_token_id"].is_null());
  // torch reads it back: names, shapes and sums in float64.
  const std::string probe = shell(std::string(ZRT_PYTHON) + " -c 'import torch' ", &status);
  if (status != 0) {
    WARN("SKIPPED the torch read-back of the export: " << ZRT_PYTHON << " has no torch (" << probe
                                                       << ")");
    return;
  }
  const std::string py = shell(std::string(ZRT_PYTHON) + " " + ZRT_TORCH_CHECK + " " + st, &status);
  INFO(py);
  REQUIRE(status == 0);
  const auto sums = nlohmann::json::parse(py);
  CHECK(sums["__metadata__"]["format"] == "pt");
  for (std::size_t p = 0; p < index.params.size(); ++p) {
    const auto& row = sums[index.params[p].name];
    INFO(index.params[p].name);
    CHECK(row["shape"].get<std::vector<std::int64_t>>() == index.params[p].shape);
    double sum = 0.0;
    for (float v : full[p]) sum += v;
    CHECK(row["sum"].get<double>() == Approx(sum).epsilon(1e-9).margin(1e-9));
    CHECK(row["first"].get<double>() == full[p][0]);
  }
}

TEST_CASE("zrt-ckpt: --help, a write that fails says why, loss scale for fp16 only", "[zrt-ckpt]") {
  const std::string tool = ZRT_CKPT;
  int status = 0;
  const std::string help = shell(tool + " --help", &status);
  CHECK(status == 0);
  for (const char* command : {"inspect", "verify", "consolidate", "export"}) {
    CHECK_THAT(help, Catch::Contains(command));
  }
  CHECK(shell(tool + " inspect", &status).find("usage") != std::string::npos);
  CHECK(status == 2);

  Job j;
  j.steps = 1;
  j.save_interval = 1;
  j.ranks = 1;
  j.fp16 = true;
  run_ok("tool_fp16", j);
  const std::string save_dir = (root() / "tool_fp16" / "ckpt").string();
  CHECK_THAT(shell(tool + " inspect " + save_dir, &status), Catch::Contains("loss scale   65536"));
  CHECK(status == 0);
  j.fp16 = false;
  j.bf16 = true;
  run_ok("tool_bf16", j);
  CHECK_THAT(shell(tool + " inspect " + (root() / "tool_bf16" / "ckpt").string(), &status),
             !Catch::Contains("loss scale"));

  // The output's folder cannot be made (a file is in the way): the reason is given.
  const fs::path blocker = root() / "tool_fp16" / "a_file";
  std::ofstream(blocker) << "not a folder";
  const std::string failed =
      shell(tool + " export " + save_dir + " --safetensors " + (blocker / "m.safetensors").string(),
            &status);
  CHECK(status == 1);
  CHECK_THAT(failed, Catch::Contains("cannot create the folder " + blocker.string()));
  CHECK_THAT(failed, Catch::Contains("Not a directory"));
  // A write that fails after the folder exists (the output is a folder) says why too.
  const fs::path folder = root() / "tool_fp16" / "a_folder.h5";
  fs::create_directories(folder);
  const std::string refused =
      shell(tool + " export " + save_dir + " --safetensors " + folder.string(), &status);
  CHECK(status == 1);
  CHECK_THAT(refused, Catch::Contains(folder.string()));
  CHECK_THAT(refused, Catch::Contains("directory"));
}

namespace {

std::vector<nlohmann::json> metrics_rows(const std::string& name) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(root() / name / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

std::vector<std::int64_t> row_steps(const std::vector<nlohmann::json>& rows) {
  std::vector<std::int64_t> steps;
  for (const auto& row : rows) steps.push_back(row["step"].get<std::int64_t>());
  return steps;
}

}  // namespace

TEST_CASE("metrics.jsonl continues across a crash, its resume and a no-op restart", "[history]") {
  Job j;
  j.steps = 6;
  j.save_interval = 3;
  std::string text;
  REQUIRE(launch("history", j, &text) == 0);
  CHECK_THAT(text, Catch::Contains("| elapsed ") && Catch::Contains("| ETA "));
  const auto first = metrics_rows("history");
  REQUIRE(row_steps(first) == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
  for (const auto& row : first) {
    CHECK(row["time"].get<double>() > 1.7e9);  // unix seconds
    CHECK(row["elapsed_s"].get<double>() >= 0.0);
  }
  CHECK(first[5]["elapsed_s"].get<double>() >= first[0]["elapsed_s"].get<double>());

  // The run "crashed" after step 6 with its last checkpoint at step 3: the restart (the same
  // config, load left at its default) resumes there and redoes steps 4-6.
  const std::string save_dir = (root() / "history" / "ckpt").string();
  std::ofstream(fs::path(save_dir) / "latest") << "global_step3\n";
  j.keep_output = true;
  text.clear();
  REQUIRE(launch("history", j, &text) == 0);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("checkpoint.load is \"auto\""));
  CHECK_THAT(text, Catch::Contains("resumed from " + save_dir + "/global_step3 at step 3"));
  CHECK_THAT(text, Catch::Contains("dropped 3 written after it"));
  const auto second = metrics_rows("history");
  REQUIRE(row_steps(second) == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
  for (std::size_t i = 0; i < 3; ++i) CHECK(second[i] == first[i]);  // kept as written
  for (std::size_t i = 3; i < 6; ++i) {
    CHECK(second[i]["time"].get<double>() > first[5]["time"].get<double>());   // rewritten
    CHECK(second[i]["loss"].get<double>() == first[i]["loss"].get<double>());  // bit-exact
  }

  // A restart of the finished run resumes at step 6, trains nothing and keeps the history.
  text.clear();
  REQUIRE(launch("history", j, &text) == 0);
  CHECK_THAT(text, Catch::Contains("nothing left to train"));
  CHECK(metrics_rows("history") == second);
}

TEST_CASE("a second run into a save_dir with checkpoints resumes, or refuses, never overwrites",
          "[overwrite]") {
  Job j;
  j.steps = 2;
  j.save_interval = 2;
  run_ok("overwrite", j);
  const std::string save_dir = (root() / "overwrite" / "ckpt").string();
  const auto stamp = fs::last_write_time(fs::path(save_dir) / "global_step2" / "index.h5");

  // "none": a fresh start would overwrite global_step2; refused before any step.
  j.keep_output = true;
  j.load = "none";
  std::string text;
  CHECK(launch("overwrite", j, &text) != 0);
  CHECK_THAT(text, Catch::Contains("checkpoint.save_dir " + save_dir +
                                   " already holds checkpoints (global_step2)"));
  CHECK_THAT(text, Catch::Contains("checkpoint.overwrite to true"));
  CHECK_THAT(text, !Catch::Contains("step      1/"));
  CHECK(fs::last_write_time(fs::path(save_dir) / "global_step2" / "index.h5") == stamp);

  // The default ("auto") resumes the finished run: nothing to do, nothing written.
  j.load = "";
  text.clear();
  REQUIRE(launch("overwrite", j, &text) == 0);
  CHECK_THAT(text, Catch::Contains("resumed from " + save_dir + "/global_step2"));
  CHECK(fs::last_write_time(fs::path(save_dir) / "global_step2" / "index.h5") == stamp);

  // "none" with overwrite: the old checkpoints go and the run starts from step 1.
  j.load = "none";
  j.overwrite = true;
  j.steps = 1;
  j.save_interval = 1;
  text.clear();
  REQUIRE(launch("overwrite", j, &text) == 0);
  CHECK_THAT(text, Catch::Contains("step      1/1"));
  CHECK(*read_latest(save_dir) == "global_step1");
  CHECK_FALSE(fs::exists(fs::path(save_dir) / "global_step2"));
}
