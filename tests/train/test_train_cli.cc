// zrt-train's command line, end to end: --help, --version, --check (valid, invalid with every
// problem listed, a world size that breaks the batch rule, a setting that does not fit),
// config overrides (--a.b VALUE, --a.b=VALUE, a typo named as the option), bad usage (exit 2),
// and a short training run under mpirun where an override sets the steps and ZRT_LOG_LEVEL
// wins over the config's log_level.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/data/token_shard.h"

namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::temp_directory_path() / "zrt_test_train_cli";

struct Outcome {
  int status = 0;
  std::string output;  // stdout and stderr
};

Outcome run_command(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((command + " 2>&1").c_str(), "r"), pclose);
  Outcome o;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) o.output += buf.data();
  const int rc = pclose(pipe.release());
  o.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  return o;
}

// zrt-train as a plain process (no mpirun), as --check, --help and --version run.
Outcome zrt_train(const std::string& args) {
  return run_command(std::string(ZRT_TRAIN_EXE) + " " + args);
}

std::string write_config(const std::string& name, const std::string& text) {
  fs::create_directories(kDir);
  const fs::path path = kDir / name;
  std::ofstream(path) << text;
  return path.string();
}

const std::string kDemo = std::string(ZRT_SOURCE_DIR) + "/configs/demo.json";

}  // namespace

TEST_CASE("zrt-train --help lists every option; --version prints the project version", "[cli]") {
  const Outcome help = zrt_train("--help");
  CHECK(help.status == 0);
  for (const char* text :
       {"--config FILE", "--KEY VALUE, --KEY=VALUE", "--check", "--world N", "--version", "--help",
        "docs/config.md", "docs/config-keys.md", "ZRT_LOG_LEVEL", "exit status"}) {
    INFO(text);
    CHECK_THAT(help.output, Catch::Contains(text));
  }
  const Outcome version = zrt_train("--version");
  CHECK(version.status == 0);
  CHECK_THAT(version.output, Catch::StartsWith(std::string("zrt-train ") + ZRT_PROJECT_VERSION));
}

TEST_CASE("zrt-train --check validates and estimates without mpirun", "[cli][check]") {
  // The demo's world size comes from its batch numbers: 16 = 4 x 1 x 4 ranks.
  const Outcome demo = zrt_train("--check --config " + kDemo);
  INFO(demo.output);
  CHECK(demo.status == 0);
  CHECK_THAT(demo.output, Catch::Contains("is valid for 4 ranks"));
  CHECK_THAT(demo.output,
             Catch::Contains("batch: train_batch_size 16 = micro-batch 4 x accumulation 1 x 4"));
  // The resolved config: the batch rule solved and defaults the file leaves out filled in.
  CHECK_THAT(demo.output, Catch::Contains("\"gradient_accumulation_steps\": 1"));
  CHECK_THAT(demo.output, Catch::Contains("\"timeout_s\": 600.0"));
  CHECK_THAT(demo.output, Catch::Contains("memory (zrt-mem): stage 3"));
  CHECK_THAT(demo.output, Catch::Contains("verdict: stage 0 fits"));
  CHECK_THAT(demo.output, Catch::Contains("result: OK"));

  // Another world size breaks the file's batch rule.
  const Outcome three = zrt_train("--check --config " + kDemo + " --world 3");
  CHECK(three.status == 1);
  CHECK_THAT(three.output,
             Catch::Contains("train_batch_size 16 is not micro 4 × accumulation 1 × world 3"));

  // Without the three batch numbers the world is assumed: sequence parallelism's group at
  // least, and an invalid result says it was assumed.
  const Outcome sp_assumed =
      zrt_train("--check --config " + kDemo +
                " --gradient_accumulation_steps null --sequence_parallel_size 2");
  INFO(sp_assumed.output);
  CHECK(sp_assumed.status == 0);
  CHECK_THAT(sp_assumed.output, Catch::Contains("is valid for 2 ranks"));
  const Outcome sp_bad = zrt_train("--check --config " + kDemo +
                                   " --gradient_accumulation_steps null --sequence_parallel_size 2 "
                                   "--train_batch_size 6");
  INFO(sp_bad.output);
  CHECK(sp_bad.status == 1);
  CHECK_THAT(sp_bad.output, Catch::Contains("(checked for 2 ranks, --check's assumption: give "
                                            "--world N"));

  // Valid, but the setting does not fit the device it names.
  const Outcome small = zrt_train("--check --config " + kDemo + " --device.memory_limit_gb 0.001");
  INFO(small.output);
  CHECK(small.status == 1);
  CHECK_THAT(small.output, Catch::Contains("DOES NOT FIT"));
  CHECK_THAT(small.output, Catch::Contains("result: the config is valid but does not fit"));

  // Every problem in one run, the most fundamental first.
  const std::string bad = write_config("bad.json", R"({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "Lamb", "params": {"max_coeff": 10}},
    "zero_optimization": {"stge": 2},
    "gradient_clipping": "auto",
    "model": {"preset": "gpt2-tiny"},
    "data": {"train": "t.bin"},
    "train": {"steps": 10, "eval_interval": 5}
  })");
  const Outcome invalid = zrt_train("--check --config " + bad);
  INFO(invalid.output);
  CHECK(invalid.status == 1);
  CHECK_THAT(
      invalid.output,
      Catch::Contains("config: INVALID: 4 problems (the most fundamental first)\n"
                      "  " +
                      bad +
                      ": optimizer type 'Lamb' is not supported by zrt; supported types: "
                      "Adam, AdamW, Lion\n"
                      "  " +
                      bad +
                      ": zero_optimization.stge: unknown key; did you mean 'stage'?\n"
                      "  " +
                      bad +
                      ": gradient_clipping: \"auto\" is filled in by Hugging Face's "
                      "Trainer and has no meaning in zrt here; expected a number >= 0\n"
                      "  " +
                      bad + ": train.eval_interval: evaluation every 5 steps needs data.val\n"));
  CHECK_THAT(invalid.output, !Catch::Contains("max_coeff"));

  // The model's own checks run before the config is called valid: sequence parallelism over 8
  // ranks cannot split the demo GPT's 4 heads (its build refuses it; --check said "result: OK").
  const Outcome sp = zrt_train("--check --config " + kDemo +
                               " --world 8 --sequence_parallel_size 8 --train_batch_size 4");
  INFO(sp.output);
  CHECK(sp.status == 1);
  CHECK_THAT(sp.output, Catch::Contains("config: INVALID: 1 problem"));
  CHECK_THAT(sp.output, Catch::Contains("sequence_parallel_size 8 does not divide the model's 4 "
                                        "heads (n_head)"));
  CHECK_THAT(sp.output, !Catch::Contains("is valid for"));
  // ... and with the config's own problems, in the same list, when those leave what the model's
  // checks read intact (an optimizer typo; a data typo: of data they read only document_mask,
  // for the estimate), so one run names both.
  const std::vector<std::pair<std::string, std::string>> beside = {
      {"--optimizer.params.lrr 0.1", "--optimizer.params.lrr: unknown key; did you mean 'lr'?"},
      {"--data.shufle false", "--data.shufle: unknown key; did you mean 'shuffle'?"}};
  for (const auto& [typo, problem] : beside) {
    const Outcome both =
        zrt_train("--check --config " + kDemo +
                  " --world 8 --sequence_parallel_size 8 --train_batch_size 4 " + typo);
    INFO(both.output);
    CHECK(both.status == 1);
    CHECK_THAT(both.output,
               Catch::Contains("config: INVALID: 2 problems (the most fundamental first)\n  " +
                               problem + "\n  " + kDemo +
                               ": model: gpt2-tiny (modified): sequence_parallel_size 8 does not "
                               "divide the model's 4 heads (n_head)"));
  }
  // A problem with a key they read (the micro-batch rule) leaves them out: reported then would
  // be about a value the config does not have.
  const Outcome sp_and_batch =
      zrt_train("--check --config " + kDemo +
                " --world 8 --sequence_parallel_size 8 --train_batch_size 3"
                " --optimizer.params.lrr 0.1");
  INFO(sp_and_batch.output);
  CHECK(sp_and_batch.status == 1);
  CHECK_THAT(sp_and_batch.output, Catch::Contains("config: INVALID: 2 problems"));
  CHECK_THAT(sp_and_batch.output, !Catch::Contains("heads (n_head)"));
  // The model block's own checks (model.frozen against its names, its dimensions) read nothing
  // else, so they run beside such a problem too: one --check names a bad ZeRO stage and a
  // pattern that matches nothing.
  const Outcome frozen_and_stage =
      zrt_train("--check --config " + kDemo +
                " --zero_optimization.stage 7 --model.frozen '[\"transformer.h.9.*\"]'");
  INFO(frozen_and_stage.output);
  CHECK(frozen_and_stage.status == 1);
  CHECK_THAT(frozen_and_stage.output,
             Catch::Contains("config: INVALID: 2 problems (the most fundamental first)\n  "
                             "--zero_optimization.stage: 7 is out of range") &&
                 Catch::Contains("\n  " + kDemo +
                                 ": model: model.frozen[0] 'transformer.h.9.*' matches no "
                                 "parameter of"));
  // A problem in the model block itself leaves its draft at defaults: nothing of the model is
  // checked then (here a misspelt key beside the pattern).
  const Outcome frozen_and_model = zrt_train(
      "--check --config " + kDemo + " --model.n_layr 2 --model.frozen '[\"transformer.h.9.*\"]'");
  INFO(frozen_and_model.output);
  CHECK(frozen_and_model.status == 1);
  CHECK_THAT(frozen_and_model.output, Catch::Contains("--model.n_layr: unknown key"));
  CHECK_THAT(frozen_and_model.output, !Catch::Contains(": model: "));

  // model.frozen's patterns against the model's names, as the run's start applies them: a
  // pattern matching nothing is a problem (with the names' shapes), a match is reported.
  const Outcome typo_frozen =
      zrt_train("--check --config " + kDemo +
                " --model.frozen '[\"transformer.wte.weight\", \"transformer.h.9.*\"]'");
  INFO(typo_frozen.output);
  CHECK(typo_frozen.status == 1);
  CHECK_THAT(typo_frozen.output, Catch::Contains("config: INVALID: 1 problem"));
  CHECK_THAT(typo_frozen.output,
             Catch::Contains("model.frozen[1] 'transformer.h.9.*' matches no parameter of"));
  CHECK_THAT(typo_frozen.output, Catch::Contains("transformer.h.N.attn.c_attn.weight"));
  const Outcome frozen =
      zrt_train("--check --config " + kDemo + " --model.frozen '[\"transformer.wte.weight\"]'");
  INFO(frozen.output);
  CHECK(frozen.status == 0);
  CHECK_THAT(frozen.output, Catch::Contains("frozen by model.frozen: 1 of "));
  // GPT-2's tied embedding is used by the head too: the backward still reaches the embedding.
  CHECK_THAT(frozen.output, !Catch::Contains("backward ends"));
  // The embedding and the lower blocks frozen: the backward ends at block 2 (module 3).
  const Outcome lower = zrt_train("--check --config " + kDemo +
                                  " --model.frozen '[\"transformer.wpe.weight\", "
                                  "\"transformer.wte.weight\", \"transformer.h.[01].*\"]'");
  INFO(lower.output);
  CHECK(lower.status == 0);
  CHECK_THAT(lower.output, Catch::Contains("backward ends at module 3 of "));
  CHECK_THAT(lower.output, Catch::Contains("(transformer.h.2.ln_1.weight is the lowest trained "
                                           "parameter): the 3 modules below hold frozen "
                                           "parameters only and run no backward"));

  // A JSON syntax error stops the reading: it comes alone, with line and column.
  const std::string broken = write_config("broken.json", "{\n  \"seed\": 1,\n}\n");
  const Outcome syntax = zrt_train("--check --config " + broken);
  CHECK(syntax.status == 1);
  CHECK_THAT(syntax.output, Catch::Contains(broken + ":3:1: JSON syntax error"));
}

TEST_CASE("zrt-train overrides config keys from the command line", "[cli][overrides]") {
  const Outcome set = zrt_train("--check --config " + kDemo +
                                " --train.steps 7 --seed=99 --zero_optimization.offload_optimizer "
                                "'{\"device\": \"cpu\"}' --checkpoint.load 100");
  INFO(set.output);
  CHECK(set.status == 0);
  CHECK_THAT(set.output, Catch::Contains("(with 4 command-line overrides)"));
  CHECK_THAT(set.output, Catch::Contains("\"steps\": 7"));
  CHECK_THAT(set.output, Catch::Contains("\"seed\": 99"));
  CHECK_THAT(set.output, Catch::Contains("\"load\": \"100\""));
  CHECK_THAT(set.output, Catch::Contains("stage 3 + optimizer offload needs"));

  const Outcome typo = zrt_train("--check --config " + kDemo + " --train.stpes 5");
  CHECK(typo.status == 1);
  CHECK_THAT(typo.output, Catch::Contains("--train.stpes: unknown key; did you mean 'steps'?"));
  const Outcome wrong = zrt_train("--check --config " + kDemo + " --zero_optimization.stage=x");
  CHECK(wrong.status == 1);
  CHECK_THAT(wrong.output, Catch::Contains("--zero_optimization.stage: expected an integer in "
                                           "[0, 3], got \"x\""));
}

TEST_CASE("zrt-train rejects bad usage with exit status 2", "[cli]") {
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"", "--config FILE is required"},
      {"--check", "--config FILE is required"},
      {"--config " + kDemo + " --train.steps", "--train.steps needs a value"},
      {"--config " + kDemo + " --train.steps --check", "--train.steps needs a value"},
      {kDemo, "(the config is given as --config " + kDemo + ")"},
      {"--config " + kDemo + " --world 2", "--world is for --check"},
      {"--check --config " + kDemo + " --world two", "--world needs a positive integer"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const Outcome o = zrt_train(c.args);
    CHECK(o.status == 2);
    CHECK_THAT(o.output, Catch::Contains(c.message));
  }
}

TEST_CASE("zrt-train: an override sets the steps; ZRT_LOG_LEVEL wins over log_level",
          "[cli][log_level]") {
  fs::create_directories(kDir);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "And God said, Let there be light: and there was light. ";
  const std::vector<std::uint16_t> tokens(text.begin(), text.end());
  const std::string shard = (kDir / "tokens_000000.bin").string();
  zrt::write_shard(shard, tokens.data(), tokens.size());
  const auto config_with_level = [&](const std::string& name, const std::string& level) {
    return write_config(name + ".json", R"({
      "train_micro_batch_size_per_gpu": 1,
      "model": {"preset": "gpt2-tiny", "seq_len": 16},
      "data": {"train": ")" + shard + R"(", "shuffle": false},
      "train": {"steps": 50, "log_interval": 1},
      "device": {"type": "cpu"},
      "comm": {"timeout_s": 60},
      "log_level": ")" + level + R"(",
      "output_dir": ")" + (kDir / ("out_" + name)).string() +
                                            R"("
    })");
  };
  const auto train = [&](const std::string& environment, const std::string& config) {
    return run_command(environment + " " + ZRT_MPIEXEC + " -n 1 --oversubscribe --bind-to none " +
                       ZRT_TRAIN_EXE + " --config " + config + " --train.steps 2");
  };
  const auto metrics_rows = [&](const std::string& name) {
    std::ifstream in(kDir / ("out_" + name) / "metrics.jsonl");
    int rows = 0;
    for (std::string line; std::getline(in, line);) rows += line.find("\"step\"") != line.npos;
    return rows;
  };

  // The config says info; the environment says error: no info lines.
  const Outcome quiet = train("ZRT_LOG_LEVEL=error", config_with_level("quiet", "info"));
  INFO(quiet.output);
  CHECK(quiet.status == 0);
  CHECK_THAT(quiet.output, !Catch::Contains("[info]"));
  CHECK(metrics_rows("quiet") == 2);  // --train.steps 2 over the file's 50

  // The config says error; the environment says info: info lines.
  // (With ZRT_CPU_ISA, which the log names.)
  const Outcome loud =
      train("ZRT_LOG_LEVEL=info ZRT_CPU_ISA=scalar", config_with_level("loud", "error"));
  INFO(loud.output);
  CHECK(loud.status == 0);
  CHECK_THAT(loud.output, Catch::Contains("[info]"));
  CHECK_THAT(loud.output, Catch::Contains("CPU kernels: scalar (this CPU runs up to"));
  // Where the start-up went, part by part, in build()'s order.
  CHECK_THAT(loud.output,
             Catch::Matches(R"([\s\S]*\[info\] start-up [0-9.]+ s: device [0-9.]+ s, )"
                            R"(groups [0-9.]+ s, model [0-9.]+ s, engine state [0-9.]+ s, )"
                            R"(initialisation [0-9.]+ s, data [0-9.]+ s, checkpoints )"
                            R"([0-9.]+ s, buffers [0-9.]+ s\n[\s\S]*)"));

  // A ZRT_CPU_ISA that names no path ends the run before any work, naming the variable.
  const Outcome bad_isa = train("ZRT_CPU_ISA=sse", config_with_level("bad_isa", "info"));
  CHECK(bad_isa.status != 0);
  CHECK_THAT(bad_isa.output,
             Catch::Contains("ZRT_CPU_ISA='sse': expected auto, avx512, avx2 or scalar"));

  // Without the variable the config's level applies.
  const Outcome config_level = train("env -u ZRT_LOG_LEVEL", config_with_level("plain", "error"));
  INFO(config_level.output);
  CHECK(config_level.status == 0);
  CHECK_THAT(config_level.output, !Catch::Contains("[info]"));

  // train.sample_tokens: bytes after the last step for a byte-level model; another vocabulary
  // gets a warning at the start and no sample (it ended without one, silently).
  const Outcome sampled = train("ZRT_LOG_LEVEL=info",
                                config_with_level("sampled", "info") + " --train.sample_tokens 4");
  INFO(sampled.output);
  CHECK(sampled.status == 0);
  CHECK_THAT(sampled.output, Catch::Contains("[info] sample: And God said"));
  const Outcome unsampled =
      train("ZRT_LOG_LEVEL=info", config_with_level("unsampled", "info") +
                                      " --train.sample_tokens 4 --model.vocab_size 300");
  INFO(unsampled.output);
  CHECK(unsampled.status == 0);
  CHECK_THAT(unsampled.output,
             Catch::Contains("train.sample_tokens 4: the sample is byte-level text and needs a "
                             "vocabulary of 256 (this model's is 300); no sample will be "
                             "generated"));
  CHECK_THAT(unsampled.output, !Catch::Contains("sample: "));

  // Training data smaller than one step's batch is legal, and said (each step repeats it).
  const Outcome small = train("ZRT_LOG_LEVEL=info", config_with_level("small", "info") +
                                                        " --train_micro_batch_size_per_gpu 1024");
  INFO(small.output);
  CHECK(small.status == 0);
  CHECK_THAT(small.output, Catch::Contains("fewer than one step's global batch of 1024 "
                                           "(train_batch_size): every step repeats them"));
  CHECK_THAT(unsampled.output, !Catch::Contains("fewer than one step's global batch"));

  // A config problem in a run is logged one problem per line, then the job ends.
  const Outcome bad = run_command(std::string(ZRT_MPIEXEC) + " -n 1 --oversubscribe " +
                                  ZRT_TRAIN_EXE + " --config " + config_with_level("bad", "info") +
                                  " --train.stpes 2 --zero_optimization.stge 1");
  CHECK(bad.status != 0);
  CHECK_THAT(bad.output,
             Catch::Contains("[error] --train.stpes: unknown key; did you mean 'steps'?\n"));
  CHECK_THAT(bad.output,
             Catch::Contains("[error] --zero_optimization.stge: unknown key; did you mean "
                             "'stage'?\n"));
  // With the model's problems beside them, as --check lists them: one failed start names both
  // (a model.frozen pattern that matches nothing, with an optimizer typo, which leaves what the
  // model's checks read intact).
  const std::string both_config = config_with_level("both", "info");
  const Outcome both =
      run_command(std::string(ZRT_MPIEXEC) + " -n 1 --oversubscribe " + ZRT_TRAIN_EXE +
                  " --config " + both_config +
                  " --optimizer '{\"type\": \"AdamW\", \"params\": {\"lrr\": 0.1}}'"
                  " --model.frozen '[\"transformer.h.9.*\"]'");
  INFO(both.output);
  CHECK(both.status != 0);
  CHECK_THAT(both.output,
             Catch::Contains("[error] --optimizer.params.lrr: unknown key; did you mean 'lr'?\n"));
  CHECK_THAT(both.output, Catch::Contains("[error] " + both_config +
                                          ": model: model.frozen[0] 'transformer.h.9.*' matches "
                                          "no parameter of"));
  // A problem with a key the full model check reads (the micro-batch here) leaves that check
  // out, not the model block's own: the pattern is still named.
  const Outcome batch = run_command(
      std::string(ZRT_MPIEXEC) + " -n 1 --oversubscribe " + ZRT_TRAIN_EXE + " --config " +
      both_config + " --train_micro_batch_size_per_gpu 0 --model.frozen '[\"transformer.h.9.*\"]'");
  INFO(batch.output);
  CHECK(batch.status != 0);
  CHECK_THAT(batch.output, Catch::Contains("train_micro_batch_size_per_gpu"));
  CHECK_THAT(batch.output, Catch::Contains("[error] " + both_config +
                                           ": model: model.frozen[0] 'transformer.h.9.*' matches "
                                           "no parameter of"));
}
