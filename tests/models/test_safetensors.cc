// The safetensors reader and GPT-2 weight loading (model.init_from): a round trip through a
// file written the way Hugging Face writes it, and every malformed file failing with the file,
// the tensor and what is wrong.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "kernels/kernel_context.h"
#include "models/gpt/gpt.h"
#include "models/gpt/gpt_safetensors.h"
#include "models/safetensors.h"
#include "runtime/common/error.h"

using namespace zrt;

namespace {

std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "zrt_test_safetensors";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// A raw file: header JSON text and data bytes as given (for malformed cases).
std::string raw_file(const std::string& name, const std::string& header, std::size_t data_bytes,
                     std::uint64_t claimed_length = 0) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::uint64_t n = claimed_length != 0 ? claimed_length : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  for (std::size_t i = 0; i < data_bytes; ++i) out.put('\0');
  return path;
}

struct Tiny {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("s");
  kernels::KernelContext ctx{*device, *stream};
  gpt::Gpt model{gpt::GptConfig::parse("gpt2-tiny:seq_len=16"), ctx};
};

}  // namespace

TEST_CASE("GPT-2 weights round-trip through a Hugging Face style safetensors file") {
  Tiny t;
  const auto& params = t.model.parameters();
  std::vector<std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>>
      tensors;
  std::vector<std::vector<float>> expected;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    std::vector<float> v(static_cast<std::size_t>(params[i].numel()));
    t.model.init_parameter(i, 99, 0, params[i].numel(), v.data());
    expected.push_back(v);
    // Hub files often drop the "transformer." prefix: do so for every other tensor.
    std::string name = params[i].name;
    if (i % 2 == 1) name = name.substr(12);
    tensors.push_back({name, {params[i].shape, v}});
  }
  tensors.push_back({"h.0.attn.bias", {{1, 1, 16, 16}, std::vector<float>(256, 1.f)}});
  tensors.push_back({"lm_head.weight", {params[0].shape, expected[0]}});
  const std::string path = temp_path("tiny.safetensors");
  write_safetensors(path, tensors);

  const SafetensorsFile file(path);
  CHECK(file.metadata().at("format") == "pt");
  const gpt::GptWeights weights(path, params);
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    std::vector<float> got(expected[static_cast<std::size_t>(i)].size());
    weights.read(i, 0, static_cast<std::int64_t>(got.size()), got.data());
    REQUIRE(got == expected[static_cast<std::size_t>(i)]);
  }
  // Slices, as the engine asks for them.
  std::vector<float> part(5);
  weights.read(2, 3, 5, part.data());
  CHECK(part == std::vector<float>(expected[2].begin() + 3, expected[2].begin() + 8));
}

TEST_CASE("malformed or foreign safetensors files fail with the file, tensor and problem") {
  Tiny t;
  const auto& params = t.model.parameters();
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  CHECK_NOTHROW(SafetensorsFile(raw_file("ok.st", ok, 24)));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {raw_file("past.st", R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 20),
       "data_offsets [0, 24] run past the 20 bytes of data"},
      {raw_file("size.st", R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
       "F32 x [2,3] needs 24 bytes but data_offsets span 20"},
      {raw_file("dtype.st", R"({"a":{"dtype":"I64","shape":[3],"data_offsets":[0,24]}})", 24),
       "has dtype I64; supported: F32, BF16, F16"},
      {raw_file(
           "overlap.st",
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12),
       "two tensors' data overlap at byte 4"},
      {raw_file("json.st", "{not json", 0), "the header is not valid JSON"},
      {raw_file("liar.st", ok, 24, 1u << 20), "header length 1048576 runs past the end"},
      {raw_file("fields.st", R"({"a":{"dtype":"F32","shape":[2]}})", 8),
       "tensor 'a' needs dtype, shape and data_offsets"},
  };
  for (const auto& [path, message] : cases) {
    INFO(path);
    CHECK_THROWS_WITH(SafetensorsFile(path), Catch::Contains(path) && Catch::Contains(message));
  }
  const std::string tiny = temp_path("short.st");
  std::ofstream(tiny, std::ios::binary) << "abc";
  CHECK_THROWS_WITH(SafetensorsFile(tiny), Catch::Contains("truncated: 3 bytes"));
  CHECK_THROWS_WITH(SafetensorsFile(temp_path("missing.st")), Catch::Contains("cannot open"));

  // Well-formed files that do not fit the model.
  write_safetensors(temp_path("other.st"), {{"wte.weight", {{3, 4}, std::vector<float>(12)}}});
  CHECK_THROWS_WITH(gpt::GptWeights(temp_path("other.st"), params),
                    Catch::Contains("tensor 'wte.weight' has shape (3, 4) but the model's "
                                    "'transformer.wte.weight' is (256, 64)"));
  write_safetensors(temp_path("partial.st"),
                    {{"transformer.wte.weight", {params[0].shape, std::vector<float>(256 * 64)}}});
  CHECK_THROWS_WITH(gpt::GptWeights(temp_path("partial.st"), params),
                    Catch::Contains("no tensor for parameter 'transformer.wpe.weight'"));
}
