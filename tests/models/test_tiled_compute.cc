// Tiled compute (models/transformer/tiling.h): the head's logits, loss and backward and the
// Llama family's SwiGLU MLP in tiles of rows.
//  - The rule: automatic tiles, explicit counts, off.
//  - Against transformers in float64 (tests/golden/llama_golden.json, as test_llama): the tiled
//    model (5-row head tiles and 3-row MLP tiles over 12 rows, a short last tile) gives the loss,
//    the eval loss within test_llama's 1e-5 and every gradient within its tolerance
//    (llama_golden.h's gradient_tolerance, as test_llama's).
//  - Against the untiled model in fp32: each row's logits, losses and input gradients are the
//    same computation on fewer rows, so where the BLAS gives a row the same bits at any row
//    count (checked: the loss and every gradient that is not summed over rows by a tiled GEMM
//    are the same bits; OpenBLAS's small-matrix kernels can break it for other shapes, as for
//    GPT-2's, checked against PyTorch instead) only the weights whose gradient sums over the
//    rows (the head, and with the MLP tiled gate/up/down) differ: summed in another order. Any
//    order of an fp32 sum of n products t_i is within gamma_n * sum |t_i| of the exact sum (gamma_n
//    = n u / (1 - n u), u = 2^-24; Higham, Accuracy and Stability, 3.1), so two orders differ by at
//    most 2 gamma_{n+1} sum |t_i| elementwise (+1: the accumulation into the existing gradient),
//    and in Frobenius norm, for dW = A^T B over N rows, by 2 gamma_{N+1} ||A||_F ||B||_F. For the
//    head A is dlogits, each row (softmax - onehot) / divisor of 2-norm at most sqrt(2) / divisor
//    (0 for a masked row), and B the final RMSNorm's output, each row w * x / rms(x) of 2-norm at
//    most max|w| sqrt(C): the bound needs only the norm weight. The kernel-level case checks the
//    elementwise bound on the accumulation itself (linear_backward over tiles, A and B known).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/gemm.h"
#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "models/flat_param_access.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "models/model_registry.h"
#include "models/transformer/tiling.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/models/llama_golden.h"

namespace zrt {
namespace {

using transformer::head_tile_rows;
using transformer::kTileAuto;
using transformer::kTileOff;
using transformer::tile_rows;

constexpr double kU = 1.0 / (1 << 24);  // fp32's unit roundoff
double gamma(double n) {
  return n * kU / (1 - n * kU);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Whether this machine's BLAS gives each row of a product the same bits whatever rows it is
// computed with: `rows` rows of (rows x in) -> (rows x out), the forward and the input gradient,
// whole against tiles of `tile` rows. It is the BLAS's property, not zrt's: OpenBLAS's Haswell
// and Zen kernels, and the generic ones it falls back to on a CPU it does not know, compute the
// rows past the last full block of their micro-kernel another way.
bool rows_keep_their_bits(int rows, int tile, int in, int out) {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  kernels::KernelContext ctx{*device, *stream};
  auto buffer = [&](std::int64_t n, int salt) {
    Buffer b = device->allocate(n * 4, MemCategory::kOther, "probe");
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] = std::sin(0.37 * static_cast<double>(i) + salt) * 0.5f;
    device->copy_to_device(b.device<std::byte>(), v.data(), v.size() * 4, *stream);
    stream->synchronize();  // v must outlive the copy (Device::copy_to_device)
    return b;
  };
  Buffer x = buffer(std::int64_t{rows} * in, 1), w = buffer(std::int64_t{out} * in, 2);
  Buffer dy = buffer(std::int64_t{rows} * out, 3), dw = buffer(std::int64_t{out} * in, 4);
  Buffer whole_y = buffer(std::int64_t{rows} * out, 0),
         tiled_y = buffer(std::int64_t{rows} * out, 0);
  Buffer whole_dx = buffer(std::int64_t{rows} * in, 0),
         tiled_dx = buffer(std::int64_t{rows} * in, 0);
  const auto f32 = DType::kFloat32;
  const auto write = kernels::GradWrite::kOverwrite;
  kernels::linear_forward(ctx, f32, whole_y.device<std::byte>(), x.device<std::byte>(),
                          w.device<std::byte>(), {}, rows, in, out);
  kernels::linear_backward(ctx, f32, f32, whole_dx.device<std::byte>(), dw.device<std::byte>(), {},
                           dy.device<std::byte>(), x.device<std::byte>(), w.device<std::byte>(),
                           rows, in, out, write);
  for (int r = 0; r < rows; r += tile) {
    const int n = std::min(tile, rows - r);
    kernels::linear_forward(ctx, f32, tiled_y.device<std::byte>() + std::int64_t{r} * out * 4,
                            x.device<std::byte>() + std::int64_t{r} * in * 4, w.device<std::byte>(),
                            {}, n, in, out);
    kernels::linear_backward(
        ctx, f32, f32, tiled_dx.device<std::byte>() + std::int64_t{r} * in * 4,
        dw.device<std::byte>(), {}, dy.device<std::byte>() + std::int64_t{r} * out * 4,
        x.device<std::byte>() + std::int64_t{r} * in * 4, w.device<std::byte>(), n, in, out, write);
  }
  auto host = [&](const Buffer& b) {
    std::vector<float> v(static_cast<std::size_t>(b.bytes() / 4));
    device->copy_to_host(v.data(), b.device<std::byte>(), v.size() * 4, *stream);
    stream->synchronize();
    return v;
  };
  return same_bits(host(whole_y), host(tiled_y)) && same_bits(host(whole_dx), host(tiled_dx));
}

TEST_CASE("tile_rows: automatic tiles once the whole passes four tiles' budget (one: the head)") {
  const std::int64_t MiB = 1 << 20;
  // Off, or explicit (at most the rows).
  CHECK(tile_rows(kTileOff, 100000, 1 * MiB, 64 * MiB) == 100000);
  CHECK(tile_rows(300, 1000, 4, 64 * MiB) == 300);
  CHECK(tile_rows(3000, 1000, 4, 64 * MiB) == 1000);
  // Automatic: whole up to 4 budgets, then budget-sized tiles in multiples of 64 rows.
  CHECK(tile_rows(kTileAuto, 256, MiB, 64 * MiB) == 256);
  CHECK(tile_rows(kTileAuto, 257, MiB, 64 * MiB) == 64);
  // Llama-3.1-8B's head at 8192 tokens in bf16: rows of 128256 padded to 128256 (a multiple of
  // 128), 2 bytes: 256 rows of logits a tile (64 MiB) instead of 2 GiB. (The budgets here are the
  // tests' own; models take kHeadTileBudgetBytes.)
  CHECK(tile_rows(kTileAuto, 8192, 128256 * 2, 64 * MiB) == 256);
  CHECK(tile_rows(kTileAuto, 100, 4 * MiB, 64 * MiB) == 64);  // never below 64 rows
  CHECK_THROWS_AS(tile_rows(-2, 100, 4, 64), InvalidArgument);
  // Whole up to one tile (the head's rule): the rows a pass holds never fall as the rows grow,
  // also where the budget is not a multiple of 64 rows (Llama-3.1-8B's bf16 logits rows: 4186
  // fit 1 GiB, tiles of 4160, so whole up to 4160 rows, not 4185). Up to 4 budgets (the MLP's)
  // they fall where tiling starts.
  CHECK(tile_rows(kTileAuto, 64, MiB, 64 * MiB, 1) == 64);
  CHECK(tile_rows(kTileAuto, 65, MiB, 64 * MiB, 1) == 64);
  for (const std::int64_t row_bytes : {MiB, std::int64_t{128256 * 2}, std::int64_t{50304 * 4}}) {
    std::int64_t held = 0;
    for (std::int64_t rows = 1; rows <= 12000; ++rows) {
      const std::int64_t now = tile_rows(kTileAuto, rows, row_bytes, 1024 * MiB, 1);
      REQUIRE(now >= held);
      held = now;
    }
  }
  CHECK(tile_rows(kTileAuto, 4185, 128256 * 2, 1024 * MiB, 1) == 4160);
  CHECK(tile_rows(kTileAuto, 256, MiB, 64 * MiB) > tile_rows(kTileAuto, 257, MiB, 64 * MiB));
  // GPT-2 (logits rows of 50304 bf16) at 8 x 1024 tokens: whole (824 MB); Llama-3.1-8B at 8192
  // tokens (128256-wide rows): 4160-row tiles (1 GiB), at 2048 whole.
  CHECK(head_tile_rows(kTileAuto, 8192, 50304 * 2) == 8192);
  CHECK(head_tile_rows(kTileAuto, 8192, 128256 * 2) == 4160);
  CHECK(head_tile_rows(kTileAuto, 2048, 128256 * 2) == 2048);
}

struct Rig {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  kernels::KernelContext ctx{*device, *stream};
  std::unique_ptr<llama::Llama> model;
  std::unique_ptr<FlatParamAccess> access;
  Buffer tokens, targets;
  TokenBatch batch;

  Rig(const nlohmann::json& g, int head_rows, int mlp_rows, bool swap_sequences = false) {
    transformer::TransformerOptions o;
    o.head_tile_rows = head_rows;
    o.mlp_tile_rows = mlp_rows;
    model = std::make_unique<llama::Llama>(test::case_config(g), ctx, o);
    const auto& params = model->parameters();
    access = std::make_unique<FlatParamAccess>(*device, *stream, params, model->num_modules(),
                                               DType::kFloat32, DType::kFloat32);
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      access->set_param(i, test::golden_weights(params[i].name, i, params[i].numel(), g["seed"]));
    }
    const auto [in, tgt] = test::golden_batch(g, swap_sequences);
    const auto bytes = static_cast<std::int64_t>(in.size() * sizeof(std::int32_t));
    tokens = device->allocate(bytes, MemCategory::kOther, "tokens");
    targets = device->allocate(bytes, MemCategory::kOther, "targets");
    device->copy_to_device(tokens.device<std::byte>(), in.data(), in.size() * 4, *stream);
    device->copy_to_device(targets.device<std::byte>(), tgt.data(), tgt.size() * 4, *stream);
    stream->synchronize();
    batch = TokenBatch{tokens.device<const std::int32_t>(), targets.device<const std::int32_t>(),
                       g["B"], g["T"]};
  }
  ~Rig() { stream->synchronize(); }
};

TEST_CASE("Tiled head and MLP match transformers in float64 (loss, eval loss, gradients)") {
  for (const auto& g : test::llama_golden()["cases"]) {
    INFO(g["label"].get<std::string>());
    Rig rig(g, 5, 3);
    const double want_loss = g["loss"];
    rig.model->forward(*rig.access, rig.batch);  // eval with targets: tiled too
    CHECK(rig.model->head_tile_rows() == 5);
    CHECK(std::abs(rig.model->read_loss() - want_loss) / want_loss <= 1e-5);
    rig.model->forward_backward(*rig.access, rig.batch, 1.0f);
    CHECK(std::abs(rig.model->read_loss() - want_loss) / want_loss <= 1e-5);
    Rig swapped(g, 5, 3, /*swap_sequences=*/true);  // the tolerances, as test_llama's
    swapped.model->forward_backward(*swapped.access, swapped.batch, 1.0f);
    const auto& params = rig.model->parameters();
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      const std::vector<float> grad = rig.access->read_grad(i);
      const double err = test::rel_error(grad, test::golden_tensor(g["grads"][params[i].name]));
      const double tolerance = test::gradient_tolerance(grad, swapped.access->read_grad(i));
      INFO(params[i].name << ": relative error " << err << ", tolerance " << tolerance);
      CHECK(err <= tolerance);
    }
    // A pass without targets keeps the whole logits (sampling reads them).
    TokenBatch no_targets = rig.batch;
    no_targets.targets = DevicePtr<const std::int32_t>();
    rig.model->forward(*rig.access, no_targets);
    CHECK(rig.model->head_tile_rows() == rig.batch.batch * rig.batch.seq_len);
  }
}

TEST_CASE(
    "Tiled head and MLP against untiled fp32: the same bits but the row-summed weight "
    "gradients, those within the derived bound") {
  for (const auto& g : test::llama_golden()["cases"]) {
    const std::string label = g["label"];
    INFO(label);
    Rig whole(g, kTileOff, kTileOff);
    Rig tiled(g, 5, 3);
    whole.model->forward_backward(*whole.access, whole.batch, 1.0f);
    tiled.model->forward_backward(*tiled.access, tiled.batch, 1.0f);
    const llama::Llama& m = *whole.model;
    const llama::LlamaConfig& c = m.config();
    const int N = whole.batch.batch * whole.batch.seq_len;
    // The products the tiles run: the MLP's (3 rows) and the head's (5 rows).
    const bool bitwise = rows_keep_their_bits(N, 3, c.hidden_size, c.intermediate_size) &&
                         rows_keep_their_bits(N, 3, c.intermediate_size, c.hidden_size) &&
                         rows_keep_their_bits(N, 5, c.hidden_size, c.vocab_size);
    if (!bitwise) {
      // Then the tiled and whole runs are two fp32 roundings of the same model: each within its
      // tolerance of the float64 golden (test_llama's, measured the same way), which is what is
      // checked instead of the bits.
      WARN("this machine's BLAS (OpenBLAS core " << kernels::cpu::blas_core_name()
                                                 << ") gives a row different bits at different "
                                                    "row counts: tiled and whole are each checked "
                                                    "against float64 instead of bit for bit");
      Rig swapped(g, kTileOff, kTileOff, /*swap_sequences=*/true);
      swapped.model->forward_backward(*swapped.access, swapped.batch, 1.0f);
      const double want_loss = g["loss"];
      CHECK(std::abs(tiled.model->read_loss() - want_loss) / want_loss <= 1e-5);
      CHECK(std::abs(whole.model->read_loss() - want_loss) / want_loss <= 1e-5);
      for (int i = 0; i < static_cast<int>(m.parameters().size()); ++i) {
        const std::string& name = m.parameters()[static_cast<std::size_t>(i)].name;
        const auto want = test::golden_tensor(g["grads"][name]);
        const std::vector<float> a = whole.access->read_grad(i), b = tiled.access->read_grad(i);
        const double tolerance = test::gradient_tolerance(a, swapped.access->read_grad(i));
        INFO(name << ": whole " << test::rel_error(a, want) << ", tiled "
                  << test::rel_error(b, want) << ", tolerance " << tolerance);
        CHECK(test::rel_error(a, want) <= tolerance);
        CHECK(test::rel_error(b, want) <= tolerance);
      }
      continue;
    }
    CHECK(whole.model->read_loss() == tiled.model->read_loss());
    std::vector<bool> row_summed(m.parameters().size(), false);
    row_summed[static_cast<std::size_t>(m.head())] = true;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      for (int slot : {llama::Llama::kGateW, llama::Llama::kUpW, llama::Llama::kDownW}) {
        row_summed[static_cast<std::size_t>(m.block_param(l, slot))] = true;
      }
    }
    for (int i = 0; i < static_cast<int>(row_summed.size()); ++i) {
      INFO(m.parameters()[static_cast<std::size_t>(i)].name);
      const std::vector<float> a = whole.access->read_grad(i), b = tiled.access->read_grad(i);
      if (!row_summed[static_cast<std::size_t>(i)]) {
        CHECK(same_bits(a, b));
        continue;
      }
      if (i != m.head() || c.tie_word_embeddings) continue;  // checked against float64 above
      // The head: ||dW - dW'||_F <= 2 gamma_{N+1} ||dlogits||_F ||lnf||_F (header comment).
      const auto targets = g["targets"].get<std::vector<std::int32_t>>();
      const double loss_rows = static_cast<double>(
          std::count_if(targets.begin(), targets.end(), [](std::int32_t t) { return t >= 0; }));
      const std::vector<float> norm_w = whole.access->read_param(m.norm());
      double max_w = 0;
      for (float w : norm_w) max_w = std::max(max_w, std::abs(static_cast<double>(w)));
      const double dlogits_f = std::sqrt(2.0 * loss_rows) / N;  // divisor: B*T
      const double lnf_f = max_w * std::sqrt(static_cast<double>(N) * c.hidden_size);
      double diff = 0;
      for (std::size_t e = 0; e < a.size(); ++e) {
        const double d = static_cast<double>(a[e]) - b[e];
        diff += d * d;
      }
      const double bound = 2 * gamma(N + 1) * dlogits_f * lnf_f;
      INFO("head gradient: ||difference|| " << std::sqrt(diff) << ", bound " << bound);
      CHECK(std::sqrt(diff) <= bound);
    }
  }
}

TEST_CASE("GPT-2's tiled head matches PyTorch in float64 (tests/golden/gpt_golden.json)") {
  const auto& g = test::golden()["gpt"];
  const auto& c = g["config"];
  gpt::GptConfig config;
  config.n_layer = c["n_layer"];
  config.n_head = c["n_head"];
  config.n_embd = c["n_embd"];
  config.vocab_size = c["vocab_size"];
  config.seq_len = c["seq_len"];
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream);
  transformer::TransformerOptions o;
  o.head_tile_rows = 3;  // a short last tile unless B*T is a multiple of 3
  gpt::Gpt model(config, ctx, o);
  FlatParamAccess access(*device, *stream, model.parameters(), model.num_modules(), DType::kFloat32,
                         DType::kFloat32);
  access.init_from(model, g["seed"]);
  const auto in = g["tokens"].get<std::vector<std::int32_t>>();
  const auto tgt = g["targets"].get<std::vector<std::int32_t>>();
  const auto bytes = static_cast<std::int64_t>(in.size() * 4);
  Buffer tokens = device->allocate(bytes, MemCategory::kOther, "tokens");
  Buffer targets = device->allocate(bytes, MemCategory::kOther, "targets");
  device->copy_to_device(tokens.device<std::byte>(), in.data(), in.size() * 4, *stream);
  device->copy_to_device(targets.device<std::byte>(), tgt.data(), tgt.size() * 4, *stream);
  const TokenBatch batch{tokens.device<const std::int32_t>(), targets.device<const std::int32_t>(),
                         g["B"], g["T"]};
  model.forward_backward(access, batch, 1.0f);
  REQUIRE(model.head_tile_rows() == 3);
  const double want_loss = g["loss"];
  CHECK(std::abs(model.read_loss() - want_loss) / want_loss <= 1e-5);
  const auto& params = model.parameters();
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const double err =
        test::rel_error(access.read_grad(i), test::golden_tensor(g["grads"][params[i].name]));
    INFO(params[i].name << ": relative error " << err);
    CHECK(err <= 1e-5);
  }
}

TEST_CASE(
    "A weight gradient accumulated over row tiles is within 2 gamma_{n+1} sum |t_i| of "
    "the whole") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream);
  const int N = 96, C = 24, O = 40, tile = 20;
  std::vector<float> x(N * C), dout(N * O);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * i + 1));
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(std::cos(0.91 * i));
  const std::vector<float> w(O * C, 0.01f);
  auto buffer = [&](const std::vector<float>& v) {
    Buffer b = device->allocate(static_cast<std::int64_t>(v.size() * 4), MemCategory::kOther, "t");
    device->copy_to_device(b.device<std::byte>(), v.data(), v.size() * 4, *stream);
    stream->synchronize();  // `v` may be a temporary
    return b;
  };
  Buffer bx = buffer(x), bd = buffer(dout), bw = buffer(w);
  Buffer dinp = buffer(std::vector<float>(N * C, 0.f));
  Buffer whole = buffer(std::vector<float>(O * C, 0.f)),
         tiled = buffer(std::vector<float>(O * C, 0.f));
  kernels::linear_backward(ctx, DType::kFloat32, DType::kFloat32, dinp.device<std::byte>(),
                           whole.device<std::byte>(), DevicePtr<std::byte>(),
                           bd.device<std::byte>(), bx.device<std::byte>(), bw.device<std::byte>(),
                           N, C, O, kernels::GradWrite::kOverwrite);
  for (int r0 = 0; r0 < N; r0 += tile) {
    const int n = std::min(tile, N - r0);
    kernels::linear_backward(ctx, DType::kFloat32, DType::kFloat32,
                             dinp.device<std::byte>() + std::int64_t{r0} * C * 4,
                             tiled.device<std::byte>(), DevicePtr<std::byte>(),
                             bd.device<std::byte>() + std::int64_t{r0} * O * 4,
                             bx.device<std::byte>() + std::int64_t{r0} * C * 4,
                             bw.device<std::byte>(), n, C, O, kernels::GradWrite::kOverwrite);
  }
  std::vector<float> a(O * C), b(O * C);
  device->copy_to_host(a.data(), whole.device<const std::byte>(), a.size() * 4, *stream);
  device->copy_to_host(b.data(), tiled.device<const std::byte>(), b.size() * 4, *stream);
  stream->synchronize();
  int differing = 0;
  for (int o = 0; o < O; ++o) {
    for (int c = 0; c < C; ++c) {
      double abs_sum = 0, exact = 0;
      for (int i = 0; i < N; ++i) {
        const double t = static_cast<double>(dout[i * O + o]) * x[i * C + c];
        abs_sum += std::abs(t);
        exact += t;
      }
      const std::size_t e = static_cast<std::size_t>(o) * C + c;
      CHECK(std::abs(static_cast<double>(a[e]) - b[e]) <= 2 * gamma(N + 1) * abs_sum);
      CHECK(std::abs(b[e] - exact) <= gamma(N + 1) * abs_sum);
      differing += a[e] != b[e];
    }
  }
  WARN(differing << " of " << O * C << " elements differ between the whole sum and the tiles'");
}

}  // namespace
}  // namespace zrt

namespace zrt {
namespace {

TEST_CASE("The tiled head's bytes at 64K tokens of Llama-3.1-8B (past 2^31 bytes of logits)") {
  const auto l8b = builtin_models().parse_spec("llama-3.1-8b:seq_len=65536");
  ModelOptions whole;
  whole.activation_checkpointing = true;
  whole.head_tile_rows = whole.mlp_tile_rows = kTileOff;
  ModelOptions tiled = whole;
  tiled.head_tile_rows = kTileAuto;
  const std::int64_t T = 65536, V = 128256;  // V is a multiple of 128: rows are unpadded
  // Automatic: 4160 rows of bf16 logits a tile (1 GiB, rounded down to 64 rows) instead of T
  // rows (16 GiB).
  CHECK(l8b->activation_footprint(1, T, DType::kBFloat16, whole).device -
            l8b->activation_footprint(1, T, DType::kBFloat16, tiled).device ==
        (T - 4160) * V * 2);
  // Checkpointing without cpu_checkpointing keeps nothing on the host.
  CHECK(l8b->activation_footprint(1, T, DType::kBFloat16, whole).pinned_host == 0);
}

}  // namespace
}  // namespace zrt
