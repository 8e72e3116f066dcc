// Bad data and weights through zrt-train itself (end to end, 2 ranks under mpirun): a
// missing, truncated or foreign token shard, tokens outside the vocabulary, and safetensors
// files whose offsets run past the end or whose header lies about sizes. Each must end the job
// quickly with a non-zero status and an error naming the file and what is wrong; never a
// hang, a crash or a silent start. (The readers' own checks are unit-tested in
// tests/data/test_token_dataset.cc and tests/models/test_safetensors.cc.)
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt/gpt.h"
#include "models/safetensors.h"
#include "runtime/data/token_shard.h"

namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::temp_directory_path() / "zrt_test_train_bad_inputs";

struct Outcome {
  int status = 0;
  std::string output;
  double seconds = 0;
};

// Runs zrt-train on 2 ranks with the given data and init_from; returns status and output.
Outcome train_with(const std::string& name, const std::string& train_glob,
                   const std::string& init_from = "") {
  const fs::path config = kDir / (name + ".json");
  std::ofstream(config) << R"({
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 1},
    "model": {"preset": "gpt2-tiny", "seq_len": 16)"
                        << (init_from.empty() ? "" : ", \"init_from\": \"" + init_from + "\"")
                        << R"(},
    "data": {"train": ")"
                        << train_glob << R"(", "shuffle": false},
    "train": {"steps": 3, "log_interval": 1},
    "device": {"type": "cpu"},
    "comm": {"timeout_s": 20},
    "output_dir": ")" << (kDir / ("out_" + name)).string()
                        << R"("
  })";
  const std::string cmd = std::string(ZRT_MPIEXEC) + " -n 2 --oversubscribe --bind-to none " +
                          ZRT_TRAIN_EXE + " --config " + config.string() + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  Outcome o;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) o.output += buf.data();
  const int rc = pclose(pipe.release());
  o.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A safetensors file with one header and `data_bytes` zero bytes of data.
void write_raw_safetensors(const fs::path& path, std::string header, std::size_t data_bytes) {
  while (header.size() % 8 != 0) header.push_back(' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_bytes(path, bytes + header + std::string(data_bytes, '\0'));
}

}  // namespace

TEST_CASE("zrt-train ends with a clear error on bad data and weights", "[bad_inputs]") {
  fs::remove_all(kDir);
  fs::create_directories(kDir);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "And God said, Let there be light: and there was light. ";
  const std::vector<std::uint16_t> tokens(text.begin(), text.end());
  const std::string good = (kDir / "good_000000.bin").string();
  zrt::write_shard(good, tokens.data(), tokens.size());
  const std::string good_bytes = read_bytes(good);

  // Sanity: the same setup trains when nothing is wrong.
  const Outcome ok = train_with("ok", good);
  INFO(ok.output);
  REQUIRE(ok.status == 0);

  // Token shards.
  write_bytes(kDir / "trunc_000000.bin", good_bytes.substr(0, good_bytes.size() - 100));
  write_bytes(kDir / "text_000000.bin", text);
  std::string llama = good_bytes;
  const std::int32_t llama_magic = zrt::kLlama3ShardMagic;
  std::memcpy(llama.data(), &llama_magic, 4);
  write_bytes(kDir / "llama_000000.bin", llama);
  std::vector<std::uint16_t> wide(tokens);
  wide[40] = 300;  // not a byte: outside gpt2-tiny's 256-token vocabulary
  zrt::write_shard((kDir / "wide_000000.bin").string(), wide.data(), wide.size());

  // Weights: a valid file for another model, offsets past the end, a header lying about sizes.
  zrt::write_safetensors((kDir / "other.safetensors").string(),
                         {{"wte.weight", {{3, 4}, std::vector<float>(12)}}});
  write_raw_safetensors(kDir / "past.safetensors",
                        R"({"wte.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  write_raw_safetensors(kDir / "liar.safetensors",
                        R"({"wte.weight":{"dtype":"F32","shape":[256,64],"data_offsets":[0,64]}})",
                        64);
  std::string long_header(8, '\0');
  long_header[3] = 1;  // 2^24 bytes of header in a 40-byte file
  write_bytes(kDir / "length.safetensors", long_header + std::string(32, '{'));
  write_bytes(kDir / "shard_as_weights.safetensors", good_bytes);
  zrt::write_safetensors((kDir / "weights.safetensors").string(),
                         {{"wte.weight", {{4, 100}, std::vector<float>(400)}}});

  // Hugging Face model directories: a head count that contradicts the run's preset, and a head
  // that is not tied to the embedding (the model would drop it).
  fs::create_directories(kDir / "hf_heads");
  write_bytes(kDir / "hf_heads" / "config.json",
              R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, )"
              R"("vocab_size": 256, "n_positions": 16})");
  fs::create_directories(kDir / "hf_untied");
  write_bytes(kDir / "hf_untied" / "config.json",
              R"({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, )"
              R"("vocab_size": 256, "n_positions": 16})");
  {
    zrt::SafetensorsTensors weights;
    zrt::gpt::GptConfig tiny = zrt::gpt::GptConfig::preset("gpt2-tiny");
    tiny.seq_len = 16;
    for (const zrt::ParamSpec& p : zrt::gpt::Gpt::parameter_table(tiny)) {
      weights.push_back(
          {p.name, {p.shape, std::vector<float>(static_cast<std::size_t>(p.numel()), 0.01f)}});
    }
    std::vector<float> head(256 * 64, 0.01f);
    head[7] = 1.f;  // differs from wte
    weights.push_back({"lm_head.weight", {{256, 64}, head}});
    zrt::write_safetensors((kDir / "hf_untied" / "model.safetensors").string(), weights);
  }

  struct Case {
    const char* what;
    std::string train;
    std::string init_from;
    std::string message;
  };
  const std::string d = kDir.string() + "/";
  const std::vector<Case> cases = {
      {"missing shard (glob)", d + "absent_*.bin", "",
       "no file matches '" + d + "absent_*.bin' (from data.train)"},
      {"missing shard (path)", d + "absent.bin", "", d + "absent.bin: no such file"},
      {"truncated shard", d + "trunc_*.bin", "", d + "trunc_000000.bin: truncated: header says"},
      {"text instead of a shard", d + "text_*.bin", "",
       "(it looks like text: convert it with zrt-data)"},
      {"Llama-3 magic on a GPT-2 shard", d + "llama_*.bin", "",
       d + "llama_000000.bin: unsupported llm.c shard version 1 for magic 20240801: expected 7"},
      {"safetensors file as a shard", d + "weights.safetensors", "",
       d + "weights.safetensors: neither an llm.c token shard"},
      {"token outside the vocabulary", d + "wide_*.bin", "", "not below the vocabulary size 256"},
      {"weights of another model", good, d + "other.safetensors",
       "tensor 'wte.weight' has shape (3, 4) but the model's 'transformer.wte.weight' is "
       "(256, 64)"},
      {"offsets past the end", good, d + "past.safetensors",
       d + "past.safetensors: tensor 'wte.weight': data_offsets [0, 16] run past the 8 bytes "
           "of data"},
      {"header lying about sizes", good, d + "liar.safetensors",
       d + "liar.safetensors: tensor 'wte.weight': F32 x [256,64] needs 65536 bytes but "
           "data_offsets span 64"},
      {"header length past the end", good, d + "length.safetensors",
       d + "length.safetensors: header length 16777216 runs past the end of the file (40 "
           "bytes)"},
      {"a token shard as weights", good, d + "shard_as_weights.safetensors",
       d + "shard_as_weights.safetensors: header length"},
      {"a model directory with another head count", good, d + "hf_heads",
       "model.preset 'gpt2-tiny' (n_head 4) contradicts " + d + "hf_heads/config.json n_head 2"},
      {"a model directory with an untied head", good, d + "hf_untied",
       "tensor 'lm_head.weight' differs from 'transformer.wte.weight': an untied output head"},
  };
  for (const Case& c : cases) {
    const Outcome o = train_with("case", c.train, c.init_from);
    INFO(c.what << "\n" << o.output);
    CHECK(o.status != 0);
    CHECK_THAT(o.output, Catch::Contains(c.message));
    CHECK(o.seconds < 60);
    // No crash, and under ASan/UBSan (CI) no sanitizer report in any rank.
    CHECK_THAT(o.output, !Catch::Contains("Segmentation") && !Catch::Contains("Sanitizer") &&
                             !Catch::Contains("runtime error:"));
  }
}
