// Ulysses sequence parallelism end to end (sequence_parallel_size), at 4 ranks on the CPU backend,
// through zrt::train::run_training like zrt-train:
//  - a llama-tiny with weights large enough that attention is far from uniform (so rotary
//    positions and the causal mask move the loss) trains at sp 1, 2 and 4 to the per-step losses
//    of transformers' own LlamaForCausalLM in float64 on the same global batch
//    (tests/golden/make_sp_golden.py), at ZeRO stages 0-3, with optimizer (and parameter)
//    offload, with accumulation 2 and with activation checkpointing; sp 4 has fewer key/value
//    heads (2) than ranks. sp 2 and 4 also equal sp 1 more tightly;
//  - packed documents that cross the chunk boundaries, with loss masks, give sp 1's losses and
//    loss-token counts at sp 2 and 4;
//  - a checkpoint saved at sp 4 resumes at sp 1, and one saved at sp 1 resumes at sp 2, to the
//    uninterrupted run's losses (the data position is the global sample index);
//  - a rank's tracked activation peak at sp 4 is at most 0.4 of sp 1's for a 256-token sequence;
//  - the all-to-all bytes per step equal docs/multi-node.md's formula;
//  - sp 2 and 4 with MiCS shard groups and hpZ groups of any size that divides the world (ZeRO
//    shards over the whole world, not world / sp) train to the same losses;
//  - frozen lower layers end the backward at the same layer on every rank: sp 1's losses;
//  - the config errors: query heads not divisible by sp (Llama and GPT-2), sp not dividing the
//    world or the ranks per node, the batch rule counting world / sp.
// GPT-2 under sp: test_train_sp_gpt.cc.
#include "tests/train/sp_test_support.h"

#include "models/llama/llama.h"

using namespace zrt;
using namespace zrt::test::sp;

namespace {

const fs::path kShared = fs::temp_directory_path() / "zrt_test_train_sp";

nlohmann::json golden() {
  return read_golden(ZRT_SP_GOLDEN);
}

void write_data() {
  test::sp::write_data(kShared);
}

Run train_run(const std::string& name, const Job& job) {
  return test::sp::train_run(kShared, name, job);
}

}  // namespace

// fp32 against float64 over 4 steps of Adam: the losses agree to one float32 ulp of the logged
// loss (measured here, avx512: below 6e-7 relative, at every sp, stage and variant); 2e-5 leaves
// room across ISAs and thread counts. Rotary positions restarting at each chunk of sp 4 move the
// first step's loss by 1.2e-3 (transformers with those position_ids), 60 times the bound.
TEST_CASE("sp 1, 2 and 4 train to transformers' float64 losses at every stage", "[sp]") {
  if (world_size() != 4) return;
  write_data();
  const nlohmann::json g = golden();
  const std::vector<double> want = g["losses"].get<std::vector<double>>();
  struct Variant {
    std::string name, zero;
    int accumulation;
    bool checkpointing;
  };
  const std::vector<Variant> variants = {
      {"stage0", R"({"stage": 0})", 1, false},
      {"stage1", R"({"stage": 1})", 1, false},
      {"stage2_accum2", R"({"stage": 2})", 2, false},
      {"stage3_ckpt", R"({"stage": 3, "stage3_param_persistence_threshold": 100})", 1, true},
      {"stage2_offload", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})", 1, false},
      {"stage3_offload",
       R"({"stage": 3, "stage3_param_persistence_threshold": 100,
           "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}})",
       2, false},
  };
  for (const Variant& v : variants) {
    std::vector<double> sp1;
    for (int sp : {1, 2, 4}) {
      Job job;
      job.sp = sp;
      job.zero = v.zero;
      // micro x accumulation x 4 / sp = 4: sp 1 has one sequence a rank, no room to accumulate.
      job.accumulation = std::min(v.accumulation, sp);
      job.checkpointing = v.checkpointing;
      job.micro = sp / job.accumulation;
      const std::string name = v.name + "_sp" + std::to_string(sp);
      INFO(name);
      const Run r = train_run(name, job);
      check_losses(r.losses, want, 2e-5);
      for (std::int64_t tokens : r.loss_tokens) CHECK(tokens == 4 * kT);
      if (sp == 1) {
        sp1 = r.losses;
        CHECK(r.sequence_bytes.empty());
      } else {
        check_losses(r.losses, sp1, 1e-5);
      }
    }
  }
}

// ZeRO shards over the whole world at any sp (the parameters are the same on every rank of an sp
// block, each rank reduces its chunk's gradients like any data-parallel rank), so MiCS shard
// groups and hpZ groups only have to divide the world: a shard group may be a whole sp block,
// half of one, or span several; an hpZ group likewise.
TEST_CASE("sp composes with MiCS and hpZ groups that divide the world", "[sp]") {
  if (world_size() != 4) return;
  write_data();
  const std::vector<double> want = golden()["losses"].get<std::vector<double>>();
  struct Variant {
    std::string name;
    int sp;
    std::string zero;
  };
  const std::string stage3 = R"("stage": 3, "stage3_param_persistence_threshold": 100)";
  const std::vector<Variant> variants = {
      {"mics4_sp2", 2, R"({"stage": 2, "mics_shard_size": 4})"},
      {"mics2_sp2", 2, "{" + stage3 + R"(, "mics_shard_size": 2})"},
      {"mics2_sp4", 4, R"({"stage": 1, "mics_shard_size": 2})"},
      {"hpz4_sp2", 2, "{" + stage3 + R"(, "zero_hpz_partition_size": 4})"},
      {"hpz2_sp4", 4, "{" + stage3 + R"(, "zero_hpz_partition_size": 2})"},
  };
  for (const Variant& v : variants) {
    Job job;
    job.sp = v.sp;
    job.micro = v.sp;
    job.zero = v.zero;
    INFO(v.name);
    const Run r = train_run(v.name, job);
    REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
    check_losses(r.losses, want, 2e-5);
  }
}

TEST_CASE("packed documents crossing chunk boundaries train as at sp 1", "[sp]") {
  if (world_size() != 4) return;
  write_data();
  for (const auto& [stage, zero] :
       {std::pair{"stage1", R"({"stage": 1})"},
        std::pair{"stage3", R"({"stage": 3, "stage3_param_persistence_threshold": 100})"}}) {
    Run sp1;
    for (int sp : {1, 2, 4}) {
      Job job;
      job.sp = sp;
      job.zero = zero;
      job.sft = true;
      job.accumulation = sp == 4 ? 2 : 1;
      job.micro = sp / job.accumulation;
      const std::string name = std::string("sft_") + stage + "_sp" + std::to_string(sp);
      INFO(name);
      const Run r = train_run(name, job);
      REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
      if (sp == 1) {
        sp1 = r;
        continue;
      }
      CHECK(r.loss_tokens == sp1.loss_tokens);
      check_losses(r.losses, sp1.losses, 1e-5);
    }
  }
}

// Frozen lower layers under sequence parallelism: the embedding and layer 0 frozen, so the
// backward ends at layer 1 on every rank of every sp block (its all-to-alls and layer 0's
// backward ones are skipped alike); sp 2 and 4 give sp 1's losses and gradient norms (the
// trained parameters' alone), at stage 2 with accumulation and at stage 3 with checkpointing.
TEST_CASE("frozen lower layers end the backward early at every sp alike", "[sp][frozen]") {
  if (world_size() != 4) return;
  write_data();
  const std::string frozen = R"(, "frozen": ["model.embed_tokens.weight", "model.layers.0.*"])";
  const std::pair<const char*, const char*> stages[] = {
      {"stage2", R"({"stage": 2})"},
      {"stage3_ckpt", R"({"stage": 3, "stage3_param_persistence_threshold": 100})"}};
  for (const auto& [stage, zero] : stages) {
    Run sp1;
    for (int sp : {1, 2, 4}) {
      Job job;
      job.sp = sp;
      job.zero = zero;
      job.model_keys = frozen;
      job.checkpointing = std::string(stage) == "stage3_ckpt";
      job.accumulation = sp == 4 ? 2 : 1;
      job.micro = sp / job.accumulation;
      const std::string name = std::string("frozen_") + stage + "_sp" + std::to_string(sp);
      INFO(name);
      const Run r = train_run(name, job);
      REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
      if (sp == 1) {
        sp1 = r;
        // Freezing changes the run: every parameter trained gives other losses.
        Job all = job;
        all.model_keys.clear();
        const Run whole = train_run(name + "_all", all);
        CHECK(whole.losses.back() != sp1.losses.back());
        continue;
      }
      check_losses(r.losses, sp1.losses, 1e-5);
      // The norm is a sum of squares of the same gradients whose sums over chunks, ranks and
      // micro-batches re-associate at sp 2 and 4 (a few ulp, 2^-24 relative, each): it moves by
      // about that much, far inside the losses' 1e-5 (model_parity.h's rule for the norms).
      REQUIRE(r.grad_norms.size() == sp1.grad_norms.size());
      for (std::size_t i = 0; i < r.grad_norms.size(); ++i) {
        CHECK(r.grad_norms[i] == Approx(sp1.grad_norms[i]).epsilon(1e-5));
      }
    }
  }
}

// Mistral's sliding window under sequence parallelism: llama-tiny's dimensions as a Mistral with
// a 5-token window, over 32-token sequences cut into chunks of 16 (sp 2) and 8 (sp 4), so the
// windows of a chunk's first 4 rows reach into the previous chunk (4 of 16 rows at sp 2, 4 of 8 at
// sp 4). Attention runs on whole sequences after the all-to-alls,
// so the window counts whole-sequence positions: sp 2 and 4 give sp 1's losses (the bound of the
// packed-documents case above), on the plain corpus and on packed documents with loss masks. The
// window matters: without it sp 1's losses differ by far more than the bound.
TEST_CASE("a sliding window across the chunk boundaries trains as at sp 1", "[sp][window]") {
  if (world_size() != 4) return;
  write_data();
  const std::string mistral_tiny =
      R"(, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
      "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0)";
  for (const bool sft : {false, true}) {
    Run sp1;
    for (int sp : {1, 2, 4}) {
      Job job;
      job.sp = sp;
      job.sft = sft;
      job.model_type = "mistral";
      job.preset = "";
      job.model_keys = mistral_tiny + R"(, "sliding_window": 5)";
      job.accumulation = sp == 4 ? 2 : 1;
      job.micro = sp / job.accumulation;
      const std::string name =
          std::string("window_") + (sft ? "sft" : "corpus") + "_sp" + std::to_string(sp);
      INFO(name);
      const Run r = train_run(name, job);
      REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
      if (sp == 1) {
        sp1 = r;
        Job unwindowed = job;
        unwindowed.model_keys = mistral_tiny;
        const Run whole = train_run(name + "_nowindow", unwindowed);
        double apart = 0;
        for (std::size_t i = 0; i < whole.losses.size(); ++i) {
          apart = std::max(apart, std::abs(whole.losses[i] - sp1.losses[i]) / sp1.losses[i]);
        }
        CHECK(apart > 1e-3);
        continue;
      }
      CHECK(r.loss_tokens == sp1.loss_tokens);
      check_losses(r.losses, sp1.losses, 1e-5);
    }
  }
}

// Qwen3's per-head q_norm / k_norm run on the chunk's rows before the all-to-alls (every head of
// the chunk's tokens; at sp 4 the two key/value heads are shared by the four ranks), with Qwen2's
// window from layer 1 on and packed documents with loss masks: sp 2 and 4 give sp 1's losses
// and loss-token counts (the bound of the cases above). test_llama '[qwen3]' checks the model
// against transformers.
TEST_CASE("Qwen3 (q_norm, k_norm, a window from layer 1) trains as at sp 1", "[sp][qwen3]") {
  if (world_size() != 4) return;
  write_data();
  Run sp1;
  for (int sp : {1, 2, 4}) {
    Job job;
    job.sp = sp;
    job.sft = true;
    job.model_type = "qwen3";
    job.preset = "";
    job.model_keys = R"(, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "sliding_window": 5, "max_window_layers": 1)";
    job.accumulation = sp == 4 ? 2 : 1;
    job.micro = sp / job.accumulation;
    const std::string name = "qwen3_sp" + std::to_string(sp);
    INFO(name);
    const Run r = train_run(name, job);
    REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
    if (sp == 1) {
      sp1 = r;
      continue;
    }
    CHECK(r.loss_tokens == sp1.loss_tokens);
    check_losses(r.losses, sp1.losses, 1e-5);
  }
}

TEST_CASE("a checkpoint saved at sp 4 resumes at sp 1, and one at sp 1 at sp 2", "[sp]") {
  if (world_size() != 4) return;
  write_data();
  const std::vector<double> want = golden()["losses"].get<std::vector<double>>();
  for (const auto& [from, to] : {std::pair{4, 1}, std::pair{1, 2}}) {
    const std::string dir =
        (kShared / ("resume_" + std::to_string(from) + "_" + std::to_string(to))).string();
    if (world_rank() == 0) fs::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    Job first;
    first.sp = from;
    first.micro = from;
    first.zero = R"({"stage": 2})";
    first.steps = 2;
    first.checkpoint = R"({"save_dir": ")" + dir + R"(", "save_interval": 2})";
    const std::string tag = std::to_string(from) + "_to_" + std::to_string(to);
    const Run a = train_run("resume_first_" + tag, first);
    check_losses(a.losses, want, 2e-5);
    Job second = first;
    second.sp = to;
    second.micro = to;
    second.zero = R"({"stage": 3, "stage3_param_persistence_threshold": 100})";
    second.steps = kSteps;
    second.checkpoint = R"({"save_dir": ")" + dir + R"(", "load": "latest"})";
    const Run b = train_run("resume_second_" + tag, second);
    INFO("sp " << from << " -> sp " << to);
    check_losses(b.losses, want, 2e-5, 2);  // steps 3 and 4, from the checkpoint of step 2
  }
}

// docs/multi-node.md: per micro-batch and layer, the forward exchanges q, k, v and the output
// and the backward their gradients. An all-to-all's payload (nccl-tests' count) is its sp
// blocks, of which a rank sends sp - 1 to the others. A block is B x (T/sp) x heads x head_dim
// elements: NH/sp heads for q and the output, max(1, NKV/sp) for k and v. With activation
// checkpointing the recompute exchanges the forward's again.
TEST_CASE("the all-to-all bytes per step are the formula's; the activation peak falls with sp",
          "[sp]") {
  if (world_size() != 4) return;
  write_data();
  const int T = 256, B = 1, L = 2, NH = 4, NKV = 2, hd = 16, S = 4;
  std::int64_t peak_sp1 = 0;
  for (int sp : {1, 2, 4}) {
    for (bool checkpointing : {false, true}) {
      Job job;
      job.sp = sp;
      job.micro = 1;
      job.accumulation = sp;  // 1 x sp x 4 / sp = 4
      job.seq_len = T;
      job.steps = 2;
      job.checkpointing = checkpointing;
      const std::string name =
          "bytes_sp" + std::to_string(sp) + (checkpointing ? "_ckpt" : std::string());
      INFO(name);
      const Run r = train_run(name, job);
      if (sp == 1) {
        if (!checkpointing) peak_sp1 = r.activation_peak;
        continue;
      }
      const std::int64_t Tl = T / sp;
      const std::int64_t blocks_per_layer =
          std::int64_t{B} * Tl * hd * S * (2 * (NH / sp) + 2 * std::max(1, NKV / sp));
      const std::int64_t passes = checkpointing ? 3 : 2;  // forward, recompute, backward
      const std::int64_t payload = job.accumulation * passes * L * sp * blocks_per_layer;
      REQUIRE(r.sequence_bytes.size() == 2);
      for (std::int64_t bytes : r.sequence_bytes) CHECK(bytes == payload);
      for (std::int64_t sent : r.sequence_sent) CHECK(sent == payload / sp * (sp - 1));
      if (sp == 4 && !checkpointing) {
        INFO("activation peak " << r.activation_peak << " at sp 4, " << peak_sp1 << " at sp 1");
        CHECK(r.activation_peak <= 0.4 * static_cast<double>(peak_sp1));
      }
    }
  }
}

TEST_CASE("sequence_parallel_size's config errors name the numbers and the fix", "[sp]") {
  const auto parse_error = [](const std::string& text, int world) {
    try {
      parse_config_text(text, world, "sp.json");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string model = R"("model": {"type": "llama", "preset": "llama-tiny", "seq_len": 32},
                               "data": {"train": "x"}, "train": {"steps": 1},
                               "device": {"type": "cpu"})";
  // sp does not divide the world.
  CHECK_THAT(parse_error(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 3, )" +
                             model + "}",
                         4),
             Catch::Contains("sequence_parallel_size: 3 does not divide the world size 4"));
  // sp does not divide the ranks per node.
  CHECK_THAT(parse_error(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 4,
                             "comm": {"ranks_per_node": 2}, )" +
                             model + "}",
                         8),
             Catch::Contains("sequence_parallel_size: 4 does not divide comm.ranks_per_node 2"));
  // The batch rule counts world / sp.
  CHECK_THAT(parse_error(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                             "gradient_accumulation_steps": 1, "sequence_parallel_size": 2, )" +
                             model + "}",
                         8),
             Catch::Contains("train_batch_size 16 is not micro 2 × accumulation 1 × "
                             "data-parallel degree 4 (world 8 / sequence_parallel_size 2) = 8"));
  const Config ok = parse_config_text(
      R"({"train_batch_size": 8, "gradient_accumulation_steps": 2, "sequence_parallel_size": 4, )" +
          model + "}",
      16, "sp.json");
  CHECK(ok.batch.micro_batch_size == 1);
  CHECK(ok.batch.world_size == 16);
  CHECK(ok.engine.sequence_parallel_size == 4);

  // Query heads that do not split over sp, key/value heads that neither split nor divide, a
  // sequence that does not: each names both numbers.
  llama::LlamaConfig c = llama::LlamaConfig::preset("llama-tiny");
  c.num_attention_heads = 6;
  c.num_key_value_heads = 3;
  c.seq_len = 30;
  const std::vector<std::string> problems = llama::Llama::sequence_parallel_problems(c, 4);
  // Every problem at once, each with the values that fit.
  REQUIRE(problems.size() == 3);
  CHECK_THAT(problems[0], Catch::Contains("sequence_parallel_size 4 does not divide the model's 6 "
                                          "query heads (num_attention_heads)") &&
                              Catch::Contains("a divisor of 6 (1, 2, 3, 6)"));
  CHECK_THAT(problems[1], Catch::Contains("sequence_parallel_size 4 and the model's 3 key/value "
                                          "heads"));
  CHECK_THAT(problems[2], Catch::Contains("sequence_parallel_size 4 does not divide the sequence "
                                          "length 30") &&
                              Catch::Contains("set model.seq_len to a multiple of 4 (28 or 32)"));
  c.num_attention_heads = 12;
  CHECK_THAT(llama::Llama::sequence_parallel_problems(c, 4)[0],
             Catch::Contains("sequence_parallel_size 4 and the model's 3 key/value heads"));
  CHECK(llama::Llama::sequence_parallel_problems(llama::LlamaConfig::preset("llama-tiny"), 4)
            .empty());
}

TEST_CASE("a run refuses a model that cannot split its heads, by name", "[sp]") {
  if (world_size() != 4) return;
  write_data();
  const auto build_error = [](const std::string& model) {
    const std::string text = R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 4,
      "model": )" + model + R"(, "data": {"train": ")" +
                             (kShared / "corpus" / "sp_train_*.bin").string() +
                             R"("}, "train": {"steps": 1}, "device": {"type": "cpu"},
      "output_dir": ")" + (kShared / "out" / "refused").string() +
                             R"("})";
    const Config config = parse_config_text(text, 4, "refused.json");
    const int rank = world_rank();
    try {
      train::run_training(config, train::RankInfo{rank, 4, rank, 4});
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(build_error(R"({"type": "llama", "preset": "llama-tiny", "seq_len": 32,
                             "hidden_size": 96, "num_attention_heads": 6,
                             "num_key_value_heads": 2})"),
             Catch::Contains("sequence_parallel_size 4 does not divide the model's 6 query heads"));
  CHECK_THAT(build_error(R"({"preset": "gpt2-tiny", "seq_len": 32, "vocab_size": 256,
                             "n_embd": 96, "n_head": 6})"),
             Catch::Contains("sequence_parallel_size 4 does not divide the model's 6 heads "
                             "(n_head)"));
}
