// zrt-train on packed SFT shards: the loss is the sum over the global batch's loss tokens divided
// by their count, so one global batch of 4 sequences split as 1x4, 2x2 or 4x1 (ranks x
// micro-batches, and every micro-batch size between) trains the same model: the per-step losses
// equal those of one rank taking the whole batch as one micro-batch, at ZeRO stages 0-3 and with
// optimizer offload. The sequences hold different numbers of loss tokens, so the old rule (the
// mean of each micro-batch's mean) gives other losses, and this test fails with it. Metrics rows
// carry the global batch's loss-token count.
//
// The np1 job writes the reference (one rank, the batch as one micro-batch); the np2 and np4 jobs
// compare with it (ctest fixture zrt_sft_reference orders them).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/comm/mpi_runtime.h"
#include "tests/data/sft_test_support.h"
#include "train/trainer.h"

using namespace zrt;

namespace {

namespace fs = std::filesystem;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

const fs::path kShared = fs::temp_directory_path() / "zrt_test_train_sft";
constexpr int kT = 32;
constexpr int kSteps = 3;

// 12 packed sequences (3 steps of 4) with 1-4 documents each and uneven masks: the loss tokens
// per sequence range from a handful to most of it. Written once, by the np1 job.
void write_data(const fs::path& dir) {
  test::SftContent c;
  c.T = kT;
  c.vocab = 256;
  c.pad = 255;
  std::uint32_t state = 7;
  auto next = [&](std::uint32_t n) {
    state = state * 1103515245u + 12345u;
    return (state >> 8) % n;
  };
  for (int s = 0; s < 4 * kSteps; ++s) {
    test::Sequence q;
    int used = 0;
    const int docs = 1 + static_cast<int>(next(4));
    for (int d = 0; d < docs && used < kT - 2; ++d) {
      const int len = std::min(kT - used, 3 + static_cast<int>(next(12)));
      const int prompt = static_cast<int>(next(static_cast<std::uint32_t>(len)));
      for (int t = 0; t < len; ++t) {
        q.tokens.push_back(next(250));
        q.mask.push_back(t >= prompt ? 1 : 0);  // the prompt is not trained
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
  fs::create_directories(dir / "train");
  test::write_bytes((dir / "train" / "sft_000000.bin").string(), test::sft_bytes(c));
}

struct Run {
  std::vector<double> losses;
  std::vector<std::int64_t> loss_tokens;
};

Run train_run(const std::string& name, const std::string& zero, int micro, int accumulation) {
  const int world = world_size();
  const std::string out = (kShared / ("np" + std::to_string(world)) / name).string();
  const std::string text = R"({
    "train_micro_batch_size_per_gpu": )" +
                           std::to_string(micro) +
                           R"(,
    "gradient_accumulation_steps": )" +
                           std::to_string(accumulation) +
                           R"(,
    "gradient_clipping": 1.0,
    "zero_optimization": )" +
                           zero +
                           R"(,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "model": {"preset": "gpt2-tiny", "seq_len": 32, "vocab_size": 256},
    "data": {"train": ")" + (kShared / "data" / "train").string() +
                           R"(", "shuffle": false},
    "train": {"steps": 3, "log_interval": 1},
    "device": {"type": "cpu"},
    "output_dir": ")" + out +
                           R"("
  })";
  const Config config = parse_config_text(text, world, name + ".json");
  const int rank = world_rank();
  train::run_training(config, train::RankInfo{rank, world, rank, world});
  MPI_Barrier(MPI_COMM_WORLD);
  Run r;
  std::ifstream in(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    r.losses.push_back(row["loss"].get<double>());
    r.loss_tokens.push_back(row["loss_tokens"].get<std::int64_t>());
  }
  REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
  return r;
}

struct Stage {
  std::string name, zero;
};
const std::vector<Stage>& stages() {
  static const std::vector<Stage> s = {
      {"stage0", R"({"stage": 0})"},
      {"stage1", R"({"stage": 1})"},
      {"stage2", R"({"stage": 2})"},
      {"stage3", R"({"stage": 3, "stage3_param_persistence_threshold": 100})"},
      {"stage3_offload", R"({"stage": 3, "stage3_param_persistence_threshold": 100,
                             "offload_optimizer": {"device": "cpu"}})"},
  };
  return s;
}

// Tolerance. Every split computes the same per-token losses and gradients; what changes is how
// fp32 groups their sums (other GEMM row counts, micro-batches added in the accumulator, the
// ranks' reduction), about 2^-24 relative per addition over at most a few hundred terms: ~1e-5
// at the first step. Adam then moves every weight by about lr x sign(gradient) where the
// gradient is far from zero, and the losses after it agree to the same order; 1e-4 leaves room
// for a gradient element near zero that flips. The old rule's losses differ by percents here.
void check_same(const Run& got, const Run& want, const std::string& what) {
  for (int i = 0; i < kSteps; ++i) {
    INFO(what << " step " << i + 1 << ": " << got.losses[i] << " vs " << want.losses[i]);
    CHECK(std::fabs(got.losses[i] - want.losses[i]) <=
          (i == 0 ? 1e-5 : 1e-4) * std::fabs(want.losses[i]));
    CHECK(got.loss_tokens[i] == want.loss_tokens[i]);
  }
}

// A one-step-per-micro-batch run of the tiny GPT on SFT shards in `train`, as JSON for the
// cases below to adjust (micro-batch 1, no accumulation, stage 1, AdamW, no shuffling).
nlohmann::json tiny_run(const std::string& train, const std::string& out) {
  return {{"train_micro_batch_size_per_gpu", 1},
          {"gradient_accumulation_steps", 1},
          {"zero_optimization", {{"stage", 1}}},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
          {"model", {{"preset", "gpt2-tiny"}, {"seq_len", 32}, {"vocab_size", 256}}},
          {"data", {{"train", train}, {"shuffle", false}}},
          {"device", {{"type", "cpu"}}},
          {"output_dir", out}};
}

train::RunSummary run_doc(const nlohmann::json& doc, const std::string& name) {
  const int world = world_size(), rank = world_rank();
  const Config config = parse_config(doc, world, name + ".json");
  return train::run_training(config, train::RankInfo{rank, world, rank, world});
}

}  // namespace

TEST_CASE("one global batch, any split: the same token-weighted loss", "[train][sft]") {
  const int world = world_size();
  const fs::path reference = kShared / "reference.json";
  if (world == 1) {
    if (world_rank() == 0) {
      fs::remove_all(kShared);
      write_data(kShared / "data");
    }
    nlohmann::json ref;
    for (const Stage& s : stages()) {
      const Run whole = train_run(s.name + "_1x4", s.zero, 4, 1);  // the batch as one micro-batch
      ref[s.name]["losses"] = whole.losses;
      ref[s.name]["loss_tokens"] = whole.loss_tokens;
      check_same(train_run(s.name + "_4x1", s.zero, 1, 4), whole, s.name + " micro 1 x 4");
      check_same(train_run(s.name + "_2x2", s.zero, 2, 2), whole, s.name + " micro 2 x 2");
    }
    // The first step's loss is a mean over the loss tokens alone: a fresh model's predictions are
    // nearly uniform, so it is close to ln 256 (a divisor counting every position, masked ones
    // too, would give about 0.45 of it here, where 51 of the 128 positions are loss tokens).
    const double first = ref["stage0"]["losses"][0].get<double>();
    CHECK(std::fabs(first - std::log(256.0)) < 0.05 * std::log(256.0));
    CHECK(ref["stage0"]["loss_tokens"][0].get<std::int64_t>() > 0);
    CHECK(ref["stage0"]["loss_tokens"][0].get<std::int64_t>() < 4 * kT);
    std::ofstream(reference) << ref.dump();
  } else {
    REQUIRE(fs::exists(reference));
    nlohmann::json ref;
    std::ifstream(reference) >> ref;
    const int G = 4 / world;  // 2 ranks x 2 micro-batches, 4 ranks x 1
    for (const Stage& s : stages()) {
      Run want;
      want.losses = ref[s.name]["losses"].get<std::vector<double>>();
      want.loss_tokens = ref[s.name]["loss_tokens"].get<std::vector<std::int64_t>>();
      check_same(train_run(s.name, s.zero, 1, G), want,
                 s.name + " " + std::to_string(world) + " ranks x " + std::to_string(G));
    }
  }
}

// A global batch with no loss token (a shard whose sequences hold only prompts: the format
// allows it, prepare-sft never writes it) is a logged, skipped step that loses nothing: the
// steps around it train exactly as on the same data without it, the evaluation, the last
// losses and the checkpoint due at it happen, and a quiet step's decision left on the device
// before it is read after it. Steps 3 and 5 (the last) are empty here; at 2+ ranks step 2
// holds one rank with no loss token (a trained step). Before empty steps were settled, step 4
// aborted ("step 3's decision settled without its unread entry") and step 5 wrote no
// checkpoint and read no loss.
TEST_CASE("a global batch with no loss token is a skipped step that loses nothing",
          "[train][sft]") {
  const int world = world_size();
  const fs::path root = kShared / ("empty_np" + std::to_string(world));
  constexpr int kRunSteps = 5;
  auto sequence = [](std::uint32_t seed, bool trained) {
    test::Sequence q;
    std::uint32_t state = seed;
    for (int t = 0; t < kT; ++t) {
      state = state * 1103515245u + 12345u;
      q.tokens.push_back((state >> 8) % 250);
      // A prompt of 5 tokens, then the answer; or only a prompt (all of it masked).
      q.mask.push_back(trained && t >= 5 ? 1 : 0);
    }
    q.ends.push_back(kT);
    return q;
  };
  auto write_shard = [](const fs::path& dir, const std::vector<test::Sequence>& sequences) {
    test::SftContent c;
    c.T = kT;
    c.vocab = 256;
    c.pad = 255;
    c.sequences = sequences;
    fs::create_directories(dir);
    test::write_bytes((dir / "sft_000000.bin").string(), test::sft_bytes(c));
  };
  if (world_rank() == 0) {
    fs::remove_all(root);
    // Step s (1-based) reads sequences (s-1)*world .. s*world-1, rank r the r-th of them.
    std::vector<test::Sequence> with_empty, without;
    for (int s = 1; s <= kRunSteps; ++s) {
      const bool empty_step = s == 3 || s == 5;
      for (int r = 0; r < world; ++r) {
        const bool trained = !empty_step && !(s == 2 && r == 0 && world > 1);
        const test::Sequence q = sequence(static_cast<std::uint32_t>(100 * s + r), trained);
        with_empty.push_back(q);
        if (!empty_step) without.push_back(q);
      }
    }
    write_shard(root / "with_empty", with_empty);
    write_shard(root / "without", without);
    std::vector<test::Sequence> val;
    for (int i = 0; i < 2 * world; ++i) val.push_back(sequence(9000u + i, true));
    write_shard(root / "val", val);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  auto run = [&](const std::string& name, int steps) {
    nlohmann::json doc = tiny_run((root / name).string(), (root / name / "out").string());
    doc["data"]["val"] = (root / "val").string();
    doc["zero_optimization"] = {{"stage", 2}};
    doc["train"] = {
        {"steps", steps}, {"log_interval", 10}, {"eval_interval", 2}, {"eval_batches", 2}};
    doc["checkpoint"] = {{"save_interval", 100}};
    return run_doc(doc, name);
  };
  const train::RunSummary got = run("with_empty", kRunSteps);
  const train::RunSummary want = run("without", 3);
  MPI_Barrier(MPI_COMM_WORLD);

  CHECK(got.steps == kRunSteps);
  // The same trained steps, in the same order, on the same ranks: the same bits.
  REQUIRE(want.losses.size() == 3);
  REQUIRE(got.losses.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(got.losses[i] == want.losses[i]);
  // Evaluations at steps 2, 4 and 5 (the last) against 2 and 3 (the last) without the empty
  // steps; nothing trains between 4 and 5.
  REQUIRE(want.eval_losses.size() == 2);
  REQUIRE(got.eval_losses.size() == 3);
  CHECK(got.eval_losses[0] == want.eval_losses[0]);
  CHECK(got.eval_losses[1] == want.eval_losses[1]);
  CHECK(got.eval_losses[2] == got.eval_losses[1]);
  // The save due after the last step, though it trained nothing.
  const auto latest =
      checkpoint::read_latest((root / "with_empty" / "out" / "checkpoints").string());
  REQUIRE(latest.has_value());
  CHECK(*latest == checkpoint::Checkpointer::tag_for_step(kRunSteps));
  // The metrics: the empty steps' rows, and the last trained step's loss read.
  if (world_rank() == 0) {
    std::ifstream in((root / "with_empty" / "out" / "metrics.jsonl").string());
    std::vector<std::int64_t> empty_rows;
    std::string line;
    while (std::getline(in, line)) {
      const auto row = nlohmann::json::parse(line);
      if (row.value("skipped_reason", std::string()) == "no loss token") {
        empty_rows.push_back(row["step"].get<std::int64_t>());
        CHECK(row["loss_tokens"].get<std::int64_t>() == 0);
      }
    }
    CHECK(empty_rows == std::vector<std::int64_t>{3, 5});
  }
}

// An evaluation reads the validation split at most once: 3 validation sequences (uneven loss
// tokens) evaluated by W ranks at micro-batch 1 cover 3 of their ceil(3/W) x W rows, the rest
// padding with no loss token, and the loss equals one rank's over the 3 sequences in one
// micro-batch (the np1 job's reference). train.eval_batches larger than the split needs, or 0,
// evaluates the split once, no more. Before, the rows wrapped into a second pass and the first
// sequences counted twice (at 1 rank, 4 micro-batches read sequence 0 twice). lr 0 keeps the
// model at its (world-independent) initialisation, so every run evaluates the same weights.
TEST_CASE("an evaluation counts each validation sequence once", "[train][sft][eval]") {
  const int world = world_size();
  const fs::path root = kShared / "eval";
  const fs::path reference = root / "reference.json";
  auto write_shard = [](const fs::path& dir, int first_seed, int count) {
    test::SftContent c;
    c.T = kT;
    c.vocab = 256;
    c.pad = 255;
    for (int i = 0; i < count; ++i) {
      test::Sequence q;
      std::uint32_t state = static_cast<std::uint32_t>(first_seed + i);
      const int prompt = 3 + 7 * i;  // 29, 22 and 15 loss tokens of the 31 targets
      for (int t = 0; t < kT; ++t) {
        state = state * 1103515245u + 12345u;
        q.tokens.push_back((state >> 8) % 250);
        q.mask.push_back(t >= prompt ? 1 : 0);
      }
      q.ends.push_back(kT);
      c.sequences.push_back(q);
    }
    fs::create_directories(dir);
    test::write_bytes((dir / "sft_000000.bin").string(), test::sft_bytes(c));
  };
  if (world == 1) {
    fs::remove_all(root);
    write_shard(root / "train", 500, 8);
    write_shard(root / "val", 900, 3);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto val_loss = [&](const std::string& name, int micro, int eval_batches) {
    nlohmann::json doc = tiny_run((root / "train").string(),
                                  (root / ("np" + std::to_string(world)) / name).string());
    doc["train_micro_batch_size_per_gpu"] = micro;
    doc["data"]["val"] = (root / "val").string();
    doc["optimizer"]["params"] = {{"lr", 0.0}, {"weight_decay", 0.0}};
    doc["train"] = {
        {"steps", 1}, {"log_interval", 1}, {"eval_interval", 1}, {"eval_batches", eval_batches}};
    const train::RunSummary s = run_doc(doc, name);
    REQUIRE(s.eval_losses.size() == 1);
    return s.eval_losses[0];
  };
  // Sums of the same per-token losses grouped otherwise: fp32 rounding, ~1e-7 relative.
  auto same = [](double got, double want) { return std::fabs(got - want) <= 1e-5 * want; };
  if (world == 1) {
    const double whole = val_loss("whole", 3, 1);  // the 3 sequences as one micro-batch
    std::ofstream(reference) << nlohmann::json{{"val_loss", whole}}.dump();
    // A fresh model's loss is near ln 256 (its predictions nearly uniform).
    CHECK(std::fabs(whole - std::log(256.0)) < 0.05 * std::log(256.0));
    const double four = val_loss("micro1_x4", 1, 4);  // 3 sequences, then one row of padding
    INFO("1 rank, 4 micro-batches of 1: " << four << " vs " << whole);
    CHECK(same(four, whole));
    CHECK(same(val_loss("micro2_all", 2, 0), whole));  // 2 micro-batches, the last half padding
  } else {
    REQUIRE(fs::exists(reference));
    nlohmann::json ref;
    std::ifstream(reference) >> ref;
    const double whole = ref["val_loss"].get<double>();
    const int covering = (3 + world - 1) / world;  // micro-batches of 1 that cover the split
    for (int batches : {0, covering, covering + 2}) {
      const double got = val_loss("micro1_x" + std::to_string(batches), 1, batches);
      INFO(world << " ranks, eval_batches " << batches << ": " << got << " vs " << whole);
      CHECK(same(got, whole));
    }
  }
}
