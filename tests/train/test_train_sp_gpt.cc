// GPT-2 under Ulysses sequence parallelism, at 4 ranks on the CPU backend, through
// zrt::train::run_training like zrt-train (sp_test_support.h; the Llama family's own cases are
// test_train_sp.cc):
//  - a gpt2-tiny with weights large enough that attention is far from uniform and with large
//    learned position embeddings trains at sp 1, 2 and 4 to the per-step losses of transformers'
//    own GPT2LMHeadModel in float64 on the same global batch (tests/golden/make_sp_golden.py
//    --model gpt2), at ZeRO stages 0-3, with accumulation, activation checkpointing, optimizer and
//    parameter offload and MiCS; sp 2 and 4 also equal sp 1 more tightly. The packed q, k, v of
//    its one projection travel in one all-to-all (UlyssesExchange::to_heads_packed), so the
//    bytes per step are docs/multi-node.md's formula with as many key/value heads as query
//    heads;
//  - packed documents that cross the chunk boundaries, with loss masks, give sp 1's losses and
//    loss-token counts at sp 2 and 4 (each document's positions index wpe from 0);
//  - Gpt::sequence_parallel_problems names n_head and the sequence length.
#include "tests/train/sp_test_support.h"

#include "models/gpt/gpt.h"

using namespace zrt;
using namespace zrt::test::sp;

namespace {

const fs::path kShared = fs::temp_directory_path() / "zrt_test_train_sp_gpt";

Job gpt_job() {
  Job job;
  job.model_type = "gpt2";
  job.preset = "gpt2-tiny";
  return job;
}

Run train_gpt(const std::string& name, const Job& job) {
  return train_run(kShared, name, job);
}

}  // namespace

// fp32 against float64 over 4 steps of Adam, as test_train_sp.cc's bound: 2e-5 relative. Chunks
// reading wpe at their local positions instead of their global ones move the first step's loss
// by 1.2e-2 relative at sp 2 and 3.8e-2 at sp 4 (transformers with those position_ids), three
// orders of magnitude past the bound.
TEST_CASE("GPT-2 at sp 1, 2 and 4 trains to transformers' float64 losses at every stage",
          "[sp][gpt]") {
  if (world_size() != 4) return;
  write_data(kShared);
  const std::vector<double> want =
      read_golden(ZRT_SP_GPT2_GOLDEN)["losses"].get<std::vector<double>>();
  struct Variant {
    std::string name, zero;
    int accumulation;
    bool checkpointing;
  };
  const std::string stage3 = R"("stage": 3, "stage3_param_persistence_threshold": 100)";
  const std::vector<Variant> variants = {
      {"stage0", R"({"stage": 0})", 1, false},
      {"stage1_accum2", R"({"stage": 1})", 2, false},
      {"stage2_offload", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})", 1, false},
      {"stage3_ckpt_mics2", "{" + stage3 + R"(, "mics_shard_size": 2})", 1, true},
      {"stage3_offload",
       "{" + stage3 +
           R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}})",
       2, false},
  };
  const std::int64_t L = 2, NH = 4, hd = 16, S = 4;  // gpt2-tiny in fp32
  for (const Variant& v : variants) {
    std::vector<double> sp1;
    for (int sp : {1, 2, 4}) {
      Job job = gpt_job();
      job.sp = sp;
      job.zero = v.zero;
      // micro x accumulation x 4 / sp = 4: sp 1 has one sequence a rank, no room to accumulate.
      job.accumulation = std::min(v.accumulation, sp);
      job.checkpointing = v.checkpointing;
      job.micro = sp / job.accumulation;
      const std::string name = v.name + "_sp" + std::to_string(sp);
      INFO(name);
      const Run r = train_gpt(name, job);
      REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
      check_losses(r.losses, want, 2e-5);
      for (std::int64_t tokens : r.loss_tokens) CHECK(tokens == 4 * kT);
      if (sp == 1) {
        sp1 = r.losses;
        CHECK(r.sequence_bytes.empty());
        continue;
      }
      check_losses(r.losses, sp1, 1e-5);
      // Per micro-batch and layer: q, k, v (3 NH/sp heads a block) one way and the output (NH/sp)
      // back, in the forward, the recompute and the backward.
      const std::int64_t Tl = kT / sp;
      const std::int64_t block = std::int64_t{job.micro} * Tl * hd * S * 4 * (NH / sp);
      const std::int64_t passes = v.checkpointing ? 3 : 2;
      const std::int64_t payload = job.accumulation * passes * L * sp * block;
      REQUIRE(r.sequence_bytes.size() == static_cast<std::size_t>(kSteps));
      for (std::int64_t bytes : r.sequence_bytes) CHECK(bytes == payload);
      for (std::int64_t sent : r.sequence_sent) CHECK(sent == payload / sp * (sp - 1));
    }
  }
}

TEST_CASE("GPT-2: packed documents crossing chunk boundaries train as at sp 1", "[sp][gpt]") {
  if (world_size() != 4) return;
  write_data(kShared);
  Run sp1;
  for (int sp : {1, 2, 4}) {
    Job job = gpt_job();
    job.sp = sp;
    job.zero = R"({"stage": 2})";
    job.sft = true;
    job.accumulation = sp == 4 ? 2 : 1;
    job.micro = sp / job.accumulation;
    const std::string name = "sft_sp" + std::to_string(sp);
    INFO(name);
    const Run r = train_gpt(name, job);
    REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
    if (sp == 1) {
      sp1 = r;
      continue;
    }
    CHECK(r.loss_tokens == sp1.loss_tokens);
    check_losses(r.losses, sp1.losses, 1e-5);
  }
}

TEST_CASE("GPT-2's sequence-parallel problems name n_head and the sequence length", "[sp][gpt]") {
  gpt::GptConfig c = gpt::GptConfig::preset("gpt2-tiny");
  CHECK(gpt::Gpt::sequence_parallel_problems(c, 4).empty());
  CHECK(gpt::Gpt::sequence_parallel_problems(c, 1).empty());
  c.n_embd = 96;
  c.n_head = 6;
  c.seq_len = 30;
  const std::vector<std::string> problems = gpt::Gpt::sequence_parallel_problems(c, 4);
  REQUIRE(problems.size() == 2);
  CHECK_THAT(problems[0],
             Catch::Contains("sequence_parallel_size 4 does not divide the model's 6 heads "
                             "(n_head)"));
  CHECK_THAT(problems[1], Catch::Contains("sequence_parallel_size 4 does not divide the sequence "
                                          "length 30"));
}
