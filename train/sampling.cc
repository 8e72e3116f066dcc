#include "train/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "runtime/common/dtype.h"
#include "train/batch_feeder.h"

namespace zrt::train {

namespace {

// Logit v of a row of logits in the compute dtype, as a float.
float logit_value(const std::vector<std::byte>& logits, int v, DType dtype) {
  const std::byte* p = logits.data() + v * dtype_size(dtype);
  float value = 0.f;
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(&value, p, 4);
      break;
    case DType::kBFloat16: {
      bf16 h;
      std::memcpy(&h, p, 2);
      value = to_float(h);
      break;
    }
    default: {
      fp16 h;
      std::memcpy(&h, p, 2);
      value = to_float(h);
      break;
    }
  }
  return value;
}

// Draws the next byte from the logits at temperature 0.8.
int draw(const std::vector<std::byte>& logits, int vocab_size, DType dtype, std::mt19937_64& rng) {
  std::vector<double> probs(static_cast<std::size_t>(vocab_size));
  double max_logit = -1e30;
  for (int v = 0; v < vocab_size; ++v) {
    const float value = logit_value(logits, v, dtype);
    probs[static_cast<std::size_t>(v)] = value;
    max_logit = std::max(max_logit, static_cast<double>(value));
  }
  for (double& p : probs) p = std::exp((p - max_logit) / 0.8);  // temperature 0.8
  std::discrete_distribution<int> pick(probs.begin(), probs.end());
  return pick(rng);
}

}  // namespace

std::string sample_text(const Config& config, Device& device, Stream& compute, Model& model,
                        ZeroEngine& engine, int seq_len, int vocab_size) {
  const int T = seq_len;
  const DType dtype = config.engine.compute_dtype;
  std::string text = "And God said";
  std::mt19937_64 rng(config.seed);
  std::vector<std::byte> logits(static_cast<std::size_t>(vocab_size) * dtype_size(dtype));
  BatchFeeder one(device, compute, 1, T, /*documents=*/false);
  HostBatch prompt;
  prompt.batch = 1;
  prompt.seq_len = T;
  prompt.inputs.assign(static_cast<std::size_t>(T), 0);
  prompt.targets.assign(static_cast<std::size_t>(T), 0);
  for (int i = 0; i < config.train.sample_tokens; ++i) {
    const int length =
        static_cast<int>(std::min<std::size_t>(text.size(), static_cast<std::size_t>(T)));
    const std::string context = text.substr(text.size() - static_cast<std::size_t>(length));
    for (int t = 0; t < T; ++t) {
      prompt.inputs[static_cast<std::size_t>(t)] =
          t < length ? static_cast<unsigned char>(context[static_cast<std::size_t>(t)]) : 0;
    }
    TokenBatch batch = one.next(prompt, 0.f);
    batch.targets = DevicePtr<const std::int32_t>();
    model.forward(engine, batch);
    const std::int64_t stride =
        model.logits_row_stride() > 0 ? model.logits_row_stride() : vocab_size;
    const std::int64_t row = std::int64_t{length - 1} * stride;
    device.copy_to_host(logits.data(),
                        model.logits() + row * static_cast<std::int64_t>(dtype_size(dtype)),
                        logits.size(), compute);
    compute.synchronize();
    text.push_back(static_cast<char>(draw(logits, vocab_size, dtype, rng)));
  }
  return text;
}

std::string printable_sample(const std::string& bytes) {
  std::string out;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    std::size_t length = c < 0x80           ? 1
                         : (c >> 5) == 0x6  ? 2
                         : (c >> 4) == 0xE  ? 3
                         : (c >> 3) == 0x1E ? 4
                                            : 0;
    bool valid = length > 0 && i + length <= bytes.size();
    for (std::size_t k = 1; valid && k < length; ++k) {
      valid = (static_cast<unsigned char>(bytes[i + k]) >> 6) == 0x2;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (valid && (c >= 0x20 && c != 0x7f)) {
      out.append(bytes, i, length);
      i += length;
      continue;
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
    ++i;
  }
  return out;
}

}  // namespace zrt::train
