// Packed documents through a whole model (GPT-2 with learned positions, the Llama family with
// rotary positions and grouped-query attention): one row holding several documents, with
// padding and a loss mask, gives the loss and every parameter's gradient of running each
// document on its own row, summed, under the token-weighted loss (TokenBatch::loss_divisor the
// count of loss tokens over all the documents). Each check fails when attention crosses a
// boundary, when positions do not restart, when a masked target is trained, or when the loss is
// normalised by anything but the loss-token count.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "runtime/device/device.h"

namespace zrt {
namespace {

using Grads = std::vector<std::vector<float>>;

// One model on the CPU backend in fp32, with flat parameters initialised from a seed.
template <typename ModelT, typename ConfigT, typename OptionsT>
struct Rig {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<kernels::KernelContext> ctx;
  std::unique_ptr<ModelT> model;
  std::unique_ptr<FlatParamAccess> access;

  explicit Rig(const ConfigT& config) {
    ctx = std::make_unique<kernels::KernelContext>(*device, *stream, kernels::KernelOptions{1});
    model = std::make_unique<ModelT>(config, *ctx, OptionsT{});
    access =
        std::make_unique<FlatParamAccess>(*device, *stream, model->parameters(),
                                          model->num_modules(), DType::kFloat32, DType::kFloat32);
    access->init_from(*model, 20261128);
  }
  ~Rig() { stream->synchronize(); }

  // forward_backward over rows of B x T: returns the loss; the gradients accumulate.
  float run(int B, int T, const std::vector<std::int32_t>& inputs,
            const std::vector<std::int32_t>& targets, const std::vector<std::int32_t>& positions,
            const std::vector<std::int32_t>& doc_start, float divisor) {
    const std::size_t n = inputs.size();
    Buffer buf =
        device->allocate(static_cast<std::int64_t>(4 * n * 4), MemCategory::kOther, "packed batch");
    const DevicePtr<std::int32_t> base = buf.device<std::int32_t>();
    auto put = [&](int k, const std::vector<std::int32_t>& v) {
      device->copy_to_device((base + static_cast<std::int64_t>(k * n)).as<std::byte>(), v.data(),
                             4 * n, *stream);
    };
    put(0, inputs);
    put(1, targets);
    TokenBatch batch{base, base + static_cast<std::int64_t>(n), B, T};
    if (!doc_start.empty()) {
      put(2, positions);
      put(3, doc_start);
      batch.positions = base + static_cast<std::int64_t>(2 * n);
      batch.doc_start = base + static_cast<std::int64_t>(3 * n);
    }
    batch.loss_divisor = divisor;
    model->forward_backward(*access, batch, 1.f);
    float loss = 0.f;
    device->copy_to_host(&loss, model->loss().template as<const std::byte>(), 4, *stream);
    stream->synchronize();
    return loss;
  }

  Grads grads() {
    Grads g;
    for (int i = 0; i < static_cast<int>(model->parameters().size()); ++i) {
      g.push_back(access->read_grad(i));
    }
    return g;
  }
};

// A document: its tokens and which of its targets are in the loss (target t predicts token t+1
// of the same document; the last token has none).
struct Doc {
  std::vector<std::int32_t> tokens;
  std::vector<bool> trained;  // per position t < size-1: is target t in the loss
};

std::vector<Doc> make_docs(int vocab) {
  // Lengths that straddle the CPU kernels' blocks, a one-token document (no target at all), and
  // masks as a chat's: the first part of a document (its prompt) not trained.
  const std::vector<int> lengths = {7, 1, 13, 5, 9};
  std::vector<Doc> docs;
  std::uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<std::int32_t>((state >> 8) % static_cast<std::uint32_t>(vocab));
  };
  for (int len : lengths) {
    Doc d;
    for (int t = 0; t < len; ++t) d.tokens.push_back(next());
    for (int t = 0; t + 1 < len; ++t) d.trained.push_back(t >= len / 3);
    docs.push_back(d);
  }
  return docs;
}

template <typename RigT>
void check_packed_equals_separate(RigT& packed_rig, RigT& alone_rig, int T) {
  const std::vector<Doc> docs = make_docs(200);
  std::int64_t loss_tokens = 0;
  for (const Doc& d : docs)
    for (bool b : d.trained) loss_tokens += b ? 1 : 0;
  REQUIRE(loss_tokens > 0);
  const float divisor = static_cast<float>(loss_tokens);

  // The packed row: the documents back to back, then padding (its own trailing document).
  std::vector<std::int32_t> in, tgt, pos, start;
  for (const Doc& d : docs) {
    const int s = static_cast<int>(in.size());
    for (std::size_t t = 0; t < d.tokens.size(); ++t) {
      in.push_back(d.tokens[t]);
      tgt.push_back(t + 1 < d.tokens.size() && d.trained[t] ? d.tokens[t + 1] : -1);
      pos.push_back(static_cast<std::int32_t>(t));
      start.push_back(s);
    }
  }
  const int pad_start = static_cast<int>(in.size());
  REQUIRE(pad_start <= T);
  for (int t = pad_start; t < T; ++t) {
    in.push_back(199);
    tgt.push_back(-1);
    pos.push_back(t - pad_start);
    start.push_back(pad_start);
  }
  const float packed_loss = packed_rig.run(1, T, in, tgt, pos, start, divisor);
  const Grads packed = packed_rig.grads();

  // Each document alone on its own row (positions 0.., one document), the same divisor.
  float alone_loss = 0.f;
  for (const Doc& d : docs) {
    std::vector<std::int32_t> ai(d.tokens), at;
    for (std::size_t t = 0; t < d.tokens.size(); ++t) {
      at.push_back(t + 1 < d.tokens.size() && d.trained[t] ? d.tokens[t + 1] : -1);
    }
    alone_loss += alone_rig.run(1, static_cast<int>(ai.size()), ai, at, {}, {}, divisor);
  }
  const Grads alone = alone_rig.grads();  // accumulated over the documents

  // Tolerance. The packed and the separate runs compute each document's activations with the
  // same operations on the same values, but the GEMMs see other row counts (other blockings) and
  // each weight gradient sums the same per-token terms grouped differently; fp32 rounds each
  // partial sum to 2^-24 relative, and no sum here has more than T = 64 terms, so each result
  // may differ by about 64 * 2^-24 ~ 4e-6 of the magnitude of its terms. Compare norm-wise with
  // 1e-5 (2.5x that). A boundary crossed, a position not restarted or a mask ignored changes the
  // results at order 1e-2 and more.
  INFO("packed loss " << packed_loss << ", documents alone " << alone_loss);
  CHECK(std::fabs(packed_loss - alone_loss) <= 1e-5 * std::fabs(alone_loss));
  REQUIRE(packed.size() == alone.size());
  for (std::size_t i = 0; i < packed.size(); ++i) {
    double diff = 0.0, ref = 0.0;
    for (std::size_t j = 0; j < packed[i].size(); ++j) {
      diff += std::pow(double(packed[i][j]) - alone[i][j], 2);
      ref += std::pow(double(alone[i][j]), 2);
    }
    INFO("parameter " << packed_rig.model->parameters()[i].name);
    CHECK(std::sqrt(diff) <= 1e-5 * std::sqrt(ref) + 1e-12);
  }
}

TEST_CASE("GPT: packed documents equal each document alone (loss and every gradient)",
          "[packed][gpt]") {
  gpt::GptConfig c = gpt::GptConfig::preset("gpt2-tiny");
  c.vocab_size = 200;
  c.seq_len = 64;
  using GptRig = Rig<gpt::Gpt, gpt::GptConfig, gpt::GptOptions>;
  GptRig packed(c), alone(c);
  check_packed_equals_separate(packed, alone, 40);
}

TEST_CASE("Llama: packed documents equal each document alone (loss and every gradient)",
          "[packed][llama]") {
  llama::LlamaConfig c = llama::LlamaConfig::preset("llama-tiny");
  c.vocab_size = 200;
  c.seq_len = 64;
  using LlamaRig = Rig<llama::Llama, llama::LlamaConfig, llama::LlamaOptions>;
  LlamaRig packed(c), alone(c);
  check_packed_equals_separate(packed, alone, 40);
}

TEST_CASE("A token of one document changes nothing of another's", "[packed][gpt]") {
  // Two documents in one row; changing a token of the first may not move the second's loss by a
  // single bit (attention and positions never cross the boundary).
  gpt::GptConfig c = gpt::GptConfig::preset("gpt2-tiny");
  c.vocab_size = 200;
  c.seq_len = 32;
  using GptRig = Rig<gpt::Gpt, gpt::GptConfig, gpt::GptOptions>;
  const int T = 20;
  std::vector<std::int32_t> in(T), tgt(T, -1), pos(T), start(T);
  for (int t = 0; t < T; ++t) {
    in[t] = (7 * t + 3) % 200;
    start[t] = t < 8 ? 0 : 8;
    pos[t] = t - start[t];
  }
  for (int t = 8; t + 1 < T; ++t) tgt[t] = in[t + 1];  // only the second document is trained
  GptRig a(c), b(c);
  const float loss_a = a.run(1, T, in, tgt, pos, start, 11.f);
  in[3] = (in[3] + 50) % 200;  // a token of the first document
  const float loss_b = b.run(1, T, in, tgt, pos, start, 11.f);
  CHECK(loss_a == loss_b);
  // And without the document boundary the change does reach the second document's loss.
  std::vector<std::int32_t> flat_pos(T), flat_start(T, 0);
  for (int t = 0; t < T; ++t) flat_pos[t] = t;
  GptRig d(c), e(c);
  const float flat_b = d.run(1, T, in, tgt, flat_pos, flat_start, 11.f);
  in[3] = (in[3] + 150) % 200;  // back to the original token
  const float flat_a = e.run(1, T, in, tgt, flat_pos, flat_start, 11.f);
  CHECK(flat_a != flat_b);
}

}  // namespace
}  // namespace zrt
