// GPU parity of the Llama family's kernels: every op of kernels/ops.h the Llama model adds
// (RMSNorm, nn.Linear with bias, RoPE with llama3 scaling, SwiGLU, grouped-query attention; RoPE
// and grouped-query attention also with packed documents) on a CUDA KernelContext against the
// same op on a CPU one (its CPU twin), on the same inputs, in fp32 (per-tensor relative error <=
// 1e-5) and with bf16 storage (<= 1e-2); then the whole tiny Llama and Qwen2 on the GPU (with and
// without checkpointing) against transformers' golden loss and gradients
// (tests/golden/llama_golden.json). Skipped (exit 77) without a GPU; under the CUDA stand-ins
// (ctest -L standin) the CUDA host paths run on the CPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "kernels/rope_table.h"
#include "models/flat_param_access.h"
#include "models/llama/llama.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/models/llama_golden.h"
#include "tests/support/gpu_test_support.h"

namespace zrt::kernels {
namespace {

using test::decode;
using test::encode;
using test::normal_values;
using Vec = std::vector<double>;

constexpr std::uint64_t kSeed = 4242;
// Several thread blocks, row chunks (64 rows) and GEMM tiles per dimension; GQA group 3.
constexpr int kB = 2, kT = 80, kC = 96, kNH = 6, kNKV = 2, kHS = 16, kI = 160;
constexpr int kN = kB * kT;

// One backend: device, stream, kernel context and named buffers (storage `dt`, or fp32).
struct Backend {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<KernelContext> ctx;
  std::map<std::string, std::pair<Buffer, DType>> buffers;

  explicit Backend(DeviceType type,
                   const KernelOptions& kernel_options = test::own_attention_kernels()) {
    DeviceOptions options;
    options.type = type;
    if (type == DeviceType::kCuda) options.index = test::gpu_index();
    device = make_device(options);
    stream = device->create_stream("compute");
    ctx = std::make_unique<KernelContext>(*device, *stream, kernel_options);
  }
  ~Backend() { stream->synchronize(); }
  Bytes put(const std::string& name, const Vec& v, DType dt) {
    const auto bytes = encode(v, dt);
    Buffer b =
        device->allocate(static_cast<std::int64_t>(bytes.size() + 64), MemCategory::kOther, name);
    device->copy_to_device(b.device<std::byte>(), bytes.data(), bytes.size(), *stream);
    stream->synchronize();
    const Bytes p = b.device<std::byte>();
    buffers[name] = {std::move(b), dt};
    return p;
  }
  Floats put_f32(const std::string& name, std::size_t n) {
    return put(name, Vec(n, 0.0), DType::kFloat32).as<float>();
  }
  // int32 ids (positions, doc_start); empty: a null pointer.
  ConstTokens put_ids(const std::string& name, const std::vector<std::int32_t>& v) {
    if (v.empty()) return {};
    const std::size_t bytes = v.size() * sizeof(std::int32_t);
    Buffer b = device->allocate(static_cast<std::int64_t>(bytes), MemCategory::kOther, name);
    device->copy_to_device(b.device<std::byte>(), v.data(), bytes, *stream);
    stream->synchronize();
    const ConstTokens p = b.device<const std::int32_t>();
    ids[name] = std::move(b);
    return p;
  }
  std::map<std::string, Buffer> ids;
  Vec get(const std::string& name, std::size_t n) {
    const auto& [b, dt] = buffers.at(name);
    std::vector<std::byte> bytes(n * dtype_size(dt));
    device->copy_to_host(bytes.data(), b.device<std::byte>(), bytes.size(), *stream);
    stream->synchronize();
    return decode(bytes, dt);
  }
};

// Runs `op` on the CPU and on the GPU (its kernels chosen by `gpu_options`) with the same inputs
// and compares the named outputs.
using Op = std::function<std::map<std::string, std::size_t>(Backend&, DType dt, DType gt)>;
void parity(const std::string& what, const Op& op,
            const KernelOptions& gpu_options = test::own_attention_kernels()) {
  for (auto [dt, gt, tol] : {std::tuple{DType::kFloat32, DType::kFloat32, 1e-5},
                             std::tuple{DType::kBFloat16, DType::kFloat32, 1e-2},
                             std::tuple{DType::kBFloat16, DType::kBFloat16, 1e-2}}) {
    Backend cpu(DeviceType::kCpu);
    Backend gpu(DeviceType::kCuda, gpu_options);
    const auto outputs = op(cpu, dt, gt);
    op(gpu, dt, gt);
    for (const auto& [name, n] : outputs) {
      const double err = test::rel_error(gpu.get(name, n), cpu.get(name, n));
      INFO(what << " " << dtype_name(dt) << "/" << dtype_name(gt) << " " << name
                << ": GPU vs CPU twin relative error " << err);
      CHECK(err <= tol);
    }
  }
}

TEST_CASE("rmsnorm: CUDA twin matches the CPU twin", "[cuda][llama]") {
  parity("rmsnorm", [](Backend& be, DType dt, DType gt) {
    const Bytes x = be.put("x", normal_values(kSeed, 1, kN * kC, 2.0, 0.3), dt);
    const Bytes w = be.put("w", normal_values(kSeed, 2, kC, 0.1, 1.0), dt);
    const Bytes dy = be.put("dy", normal_values(kSeed, 3, kN * kC), dt);
    const Bytes out = be.put("out", Vec(kN * kC, 0.0), dt);
    const Floats rstd = be.put_f32("rstd", kN);
    const Bytes dx = be.put("dx", normal_values(kSeed, 4, kN * kC, 0.1), dt);  // accumulates
    const Bytes dw = be.put("dw", Vec(kC, 0.0), gt);
    rmsnorm_forward(*be.ctx, dt, out, rstd, x, w, kN, kC, 1e-6);
    rmsnorm_backward(*be.ctx, dt, gt, dx, dw, dy, x, w, rstd, kN, kC);
    return std::map<std::string, std::size_t>{
        {"out", kN * kC}, {"rstd", kN}, {"dx", kN * kC}, {"dw", kC}};
  });
}

// A frozen RMSNorm's null weight gradient: the column sums skipped, dinp the bits of the run
// with one (the same kernels), at a width of the register-resident kernels (96) and one of the
// scalar kernels (100, not a multiple of 8).
TEST_CASE("rmsnorm backward with a null weight gradient skips it", "[cuda][llama][frozen]") {
  for (int C : {kC, 100}) {
    for (auto [dt, gt] :
         {std::pair{DType::kFloat32, DType::kFloat32}, std::pair{DType::kBFloat16, DType::kFloat32},
          std::pair{DType::kBFloat16, DType::kBFloat16}}) {
      INFO("C " << C << " " << dtype_name(dt) << " grads " << dtype_name(gt));
      const auto NC = static_cast<std::size_t>(kN) * C;
      Backend gpu(DeviceType::kCuda);
      const Bytes x = gpu.put("x", normal_values(kSeed, 31, NC, 2.0, 0.3), dt);
      const Bytes w = gpu.put("w", normal_values(kSeed, 32, C, 0.1, 1.0), dt);
      const Bytes dy = gpu.put("dy", normal_values(kSeed, 33, NC), dt);
      const Bytes out = gpu.put("out", Vec(NC, 0.0), dt);
      const Floats rstd = gpu.put_f32("rstd", kN);
      const Vec dx_start = normal_values(kSeed, 34, NC, 0.1);  // both accumulate onto it
      const Bytes dx = gpu.put("dx", dx_start, dt), dx_frozen = gpu.put("dx_frozen", dx_start, dt);
      const Bytes dw = gpu.put("dw", Vec(C, 0.0), gt);
      rmsnorm_forward(*gpu.ctx, dt, out, rstd, x, w, kN, C, 1e-6);
      rmsnorm_backward(*gpu.ctx, dt, gt, dx, dw, dy, x, w, rstd, kN, C);
      rmsnorm_backward(*gpu.ctx, dt, gt, dx_frozen, Bytes(), dy, x, w, rstd, kN, C);
      CHECK(gpu.get("dx_frozen", NC) == gpu.get("dx", NC));
      CHECK(gpu.get("dw", C) != Vec(C, 0.0));
    }
  }
}

// The weight gradient's column sums run one block row per 64-row chunk, and CUDA caps gridDim.y at
// 65535: Qwen3's per-head q/k norms at 128K tokens (B*T*heads rows of head_dim: 4,194,304 for
// Qwen3-8B's query heads) pass that. 65537 chunks here, the output gradient zero but in the last
// two, which the first 65535 blocks' second stride reaches: a launch that dropped them would give
// a zero weight gradient (and one past the cap fails to launch, on the stand-ins too).
TEST_CASE("rmsnorm backward past 65535 row chunks (per-head norms at 128K tokens)",
          "[cuda][llama]") {
  static constexpr int kChunkRows = 64, C = 2;  // narrow: the rows are the point
  static constexpr int N = 65537 * kChunkRows;
  static constexpr std::size_t NC = std::size_t{N} * C;
  parity("rmsnorm", [](Backend& be, DType dt, DType gt) {
    Vec dy_values(NC, 0.0);
    const Vec tail = normal_values(kSeed, 19, 2 * kChunkRows * C);
    std::copy(tail.begin(), tail.end(), dy_values.end() - static_cast<std::ptrdiff_t>(tail.size()));
    const Bytes x = be.put("x", normal_values(kSeed, 18, NC, 2.0, 0.3), dt);
    const Bytes w = be.put("w", normal_values(kSeed, 12, C, 0.1, 1.0), dt);
    const Bytes dy = be.put("dy", dy_values, dt);
    const Bytes out = be.put("out", Vec(NC, 0.0), dt);
    const Floats rstd = be.put_f32("rstd", N);
    const Bytes dx = be.put("dx", Vec(NC, 0.0), dt);
    const Bytes dw = be.put("dw", Vec(C, 0.0), gt);
    rmsnorm_forward(*be.ctx, dt, out, rstd, x, w, N, C, 1e-6);
    rmsnorm_backward(*be.ctx, dt, gt, dx, dw, dy, x, w, rstd, N, C);
    return std::map<std::string, std::size_t>{{"dx", NC}, {"dw", C}};
  });
}

// The register-resident RMSNorm kernels (16-bit rows, C % 8 == 0, C <= 4096: pieces of 8 per
// lane, the last lanes idle where 256 does not divide C) at the family's widths: SmolLM2-135M
// 576, Qwen2-0.5B 896, Llama-3.2-1B 2048, Llama-3.1-8B 4096, and 1000 (not a multiple of 8: the
// scalar kernels); then residual + RMSNorm in one pass against residual_forward and
// rmsnorm_forward on the CPU.
TEST_CASE("rmsnorm at Llama widths, and residual + rmsnorm in one pass", "[cuda][llama]") {
  for (int C : {576, 896, 1000, 2048, 4096}) {
    const int N = 24;  // three blocks of 8 rows
    INFO("C " << C);
    parity("rmsnorm", [N, C](Backend& be, DType dt, DType gt) {
      const Bytes x = be.put("x", normal_values(kSeed, 11, N * C, 2.0, 0.3), dt);
      const Bytes w = be.put("w", normal_values(kSeed, 12, C, 0.1, 1.0), dt);
      const Bytes dy = be.put("dy", normal_values(kSeed, 13, N * C), dt);
      const Bytes out = be.put("out", Vec(N * C, 0.0), dt);
      const Floats rstd = be.put_f32("rstd", N);
      const Bytes dx = be.put("dx", normal_values(kSeed, 14, N * C, 0.1), dt);  // accumulates
      const Bytes dw = be.put("dw", Vec(C, 0.0), gt);
      rmsnorm_forward(*be.ctx, dt, out, rstd, x, w, N, C, 1e-5);
      rmsnorm_backward(*be.ctx, dt, gt, dx, dw, dy, x, w, rstd, N, C);
      return std::map<std::string, std::size_t>{
          {"out", N * C}, {"rstd", N}, {"dx", N * C}, {"dw", C}};
    });
    parity("residual_rmsnorm_forward", [N, C](Backend& be, DType dt, DType) {
      const Bytes a = be.put("a", normal_values(kSeed, 15, N * C, 2.0, 0.3), dt);
      const Bytes b = be.put("b", normal_values(kSeed, 16, N * C), dt);
      const Bytes w = be.put("w", normal_values(kSeed, 17, C, 0.1, 1.0), dt);
      const Bytes res = be.put("res", Vec(N * C, std::nan("")), dt);
      const Bytes out = be.put("out", Vec(N * C, std::nan("")), dt);
      const Floats rstd = be.put_f32("rstd", N);
      residual_rmsnorm_forward(*be.ctx, dt, res, out, rstd, a, b, w, N, C, 1e-5);
      return std::map<std::string, std::size_t>{{"res", N * C}, {"out", N * C}, {"rstd", N}};
    });
  }
}

TEST_CASE("linear (nn.Linear layout): CUDA twin matches the CPU twin", "[cuda][llama]") {
  parity("linear", [](Backend& be, DType dt, DType gt) {
    const int OC = kI;
    const Bytes x = be.put("x", normal_values(kSeed, 11, kN * kC), dt);
    const Bytes w = be.put("w", normal_values(kSeed, 12, OC * kC, 0.1), dt);
    const Bytes b = be.put("b", normal_values(kSeed, 13, OC, 0.1), dt);
    const Bytes dy = be.put("dy", normal_values(kSeed, 14, kN * OC), dt);
    const Bytes out = be.put("out", Vec(kN * OC, 0.0), dt);
    const Bytes dx = be.put("dx", Vec(kN * kC, 0.0), dt);
    const Bytes dw = be.put("dw", Vec(OC * kC, 0.0), gt);
    const Bytes db = be.put("db", Vec(OC, 0.0), gt);
    linear_forward(*be.ctx, dt, out, x, w, b, kN, kC, OC);
    linear_backward(*be.ctx, dt, gt, dx, dw, db, dy, x, w, kN, kC, OC);
    return std::map<std::string, std::size_t>{
        {"out", kN * OC}, {"dx", kN * kC}, {"dw", OC * kC}, {"db", OC}};
  });
}

TEST_CASE("rope with llama3 scaling: CUDA twin matches the CPU twin", "[cuda][llama]") {
  parity("rope", [](Backend& be, DType dt, DType) {
    RopeScalingParams s;
    s.rope_type = "llama3";
    s.factor = 8;
    s.original_max_position_embeddings = 32;
    const RopeTable table = make_rope_table(kHS, 100.0, s);
    const std::size_t n = std::size_t{kN} * kNH * kHS;
    const Bytes x = be.put("x", normal_values(kSeed, 21, n), dt);
    const Bytes out = be.put("out", Vec(n, 0.0), dt);
    const Bytes d = be.put("d", normal_values(kSeed, 22, n), dt);
    rope_forward(*be.ctx, dt, out, x, table, kB, kT, kNH, kHS);
    rope_backward(*be.ctx, dt, d, d, table, kB, kT, kNH, kHS);  // in place
    return std::map<std::string, std::size_t>{{"out", n}, {"d", n}};
  });
}

// YaRN's table: the ramp's interpolated frequencies, and its attention factor (1.139 at factor 4)
// on the cosine and sine of both passes.
TEST_CASE("rope with yarn scaling: CUDA twin matches the CPU twin", "[cuda][llama][rope]") {
  parity("rope", [](Backend& be, DType dt, DType) {
    RopeScalingParams s;
    s.rope_type = "yarn";
    s.factor = 4;
    s.original_max_position_embeddings = 16;
    const RopeTable table = make_rope_table(kHS, 100.0, s);
    REQUIRE(table.attention_scaling > 1.1f);
    const std::size_t n = std::size_t{kN} * kNH * kHS;
    const Bytes x = be.put("x", normal_values(kSeed, 23, n), dt);
    const Bytes out = be.put("out", Vec(n, 0.0), dt);
    const Bytes d = be.put("d", normal_values(kSeed, 24, n), dt);
    rope_forward(*be.ctx, dt, out, x, table, kB, kT, kNH, kHS);
    rope_backward(*be.ctx, dt, d, d, table, kB, kT, kNH, kHS);  // in place
    return std::map<std::string, std::size_t>{{"out", n}, {"d", n}};
  });
}

TEST_CASE("swiglu: CUDA twin matches the CPU twin", "[cuda][llama]") {
  parity("swiglu", [](Backend& be, DType dt, DType) {
    const std::size_t n = std::size_t{kN} * kI;
    const Bytes g = be.put("g", normal_values(kSeed, 31, n, 2.0), dt);
    const Bytes u = be.put("u", normal_values(kSeed, 32, n), dt);
    const Bytes dy = be.put("dy", normal_values(kSeed, 33, n), dt);
    const Bytes out = be.put("out", Vec(n, 0.0), dt);
    const Bytes dg = be.put("dg", Vec(n, 0.0), dt);
    const Bytes du = be.put("du", Vec(n, 0.0), dt);
    swiglu_forward(*be.ctx, dt, out, g, u, static_cast<std::int64_t>(n));
    swiglu_backward(*be.ctx, dt, dg, du, dy, g, u, static_cast<std::int64_t>(n));
    return std::map<std::string, std::size_t>{{"out", n}, {"dg", n}, {"du", n}};
  });
}

// Grouped-query attention forward and backward on one backend at (B, T, NH, NKV, HS), inputs
// drawn from `seed`, packed documents `doc_start` (empty: none); the gradients start at zero or,
// with `accumulate`, at values of their own (the backward adds to them). Returns the outputs
// to compare.
std::map<std::string, std::size_t> run_gqa(Backend& be, DType dt, int B, int T, int NH, int NKV,
                                           int HS, std::uint64_t seed,
                                           const std::vector<std::int32_t>& doc_start = {},
                                           bool accumulate = false,
                                           GradWrite write = GradWrite::kAccumulate,
                                           int window = 0) {
  const std::size_t nq = std::size_t{1} * B * T * NH * HS, nk = std::size_t{1} * B * T * NKV * HS;
  const std::size_t nlse = std::size_t{1} * B * NH * T;
  const Bytes q = be.put("q", normal_values(seed, 41, nq), dt);
  const Bytes k = be.put("k", normal_values(seed, 42, nk), dt);
  const Bytes v = be.put("v", normal_values(seed, 43, nk), dt);
  const Bytes dy = be.put("dy", normal_values(seed, 44, nq), dt);
  const Bytes out = be.put("out", Vec(nq, 0.0), dt);
  const Floats lse = be.put_f32("lse", nlse);
  const auto start = [&](int stream, std::size_t n) {
    return accumulate ? normal_values(seed, stream, n, 0.05) : Vec(n, 0.0);
  };
  const Bytes dq = be.put("dq", start(45, nq), dt);
  const Bytes dk = be.put("dk", start(46, nk), dt);
  const Bytes dv = be.put("dv", start(47, nk), dt);
  const ConstTokens ds = be.put_ids("doc_start", doc_start);
  gqa_attention_forward(*be.ctx, dt, out, lse, q, k, v, B, T, NH, NKV, HS, ds, window);
  gqa_attention_backward(*be.ctx, dt, dq, dk, dv, dy, q, k, v, out, lse, B, T, NH, NKV, HS, ds,
                         window, write);
  return {{"out", nq}, {"lse", nlse}, {"dq", nq}, {"dk", nk}, {"dv", nk}};
}

TEST_CASE("grouped-query attention: CUDA twin matches the CPU twin", "[cuda][llama]") {
  parity("gqa attention", [](Backend& be, DType dt, DType) {
    return run_gqa(be, dt, kB, kT, kNH, kNKV, kHS, kSeed);
  });
}

// The shape the fused tensor-core attention takes for bf16 (head size 64, T a multiple of 64),
// which the packed GQA reaches through attention.cu; fp32 takes the batched-GEMM path.
TEST_CASE("grouped-query attention at a fused shape: CUDA twin matches the CPU twin",
          "[cuda][llama]") {
  parity("gqa attention (hs 64, T 128)",
         [](Backend& be, DType dt, DType) { return run_gqa(be, dt, 1, 128, 4, 2, 64, kSeed + 1); });
  // Overwriting gradients that hold other values (GradWrite::kOverwrite): zrt's kernels, which
  // accumulate, zero them first, as the CPU twin does.
  parity("gqa attention (hs 64, T 128) overwritten", [](Backend& be, DType dt, DType) {
    return run_gqa(be, dt, 1, 128, 4, 2, 64, kSeed + 1, {}, true, GradWrite::kOverwrite);
  });
}

// Head size 128, the Llama-3 8B / Mistral 7B / Qwen2.5 7B shape, group 4 (Llama-3 8B's 32 / 8):
// bf16 takes the fused mma.sync kernels at head size 128.
TEST_CASE("grouped-query attention at head size 128: CUDA twin matches the CPU twin",
          "[cuda][llama]") {
  parity("gqa attention (hs 128, T 128)", [](Backend& be, DType dt, DType) {
    return run_gqa(be, dt, 1, 128, 4, 1, 128, kSeed + 2);
  });
}

// Both CUDA paths of grouped-query attention at the fused shapes against the CPU twin: in place
// (the default: the mma kernels read each key/value head for its whole group, dK/dV summed over
// the group in registers) and packed (KernelOptions::cuda_gqa_packed: the repeated heads through
// attention.cu). Groups of 1 (multi-head), 2, 4 and 8 (Llama-3.1-8B's 32 / 8 at a quarter of its
// heads) at head sizes 64 and 128, two sequences of three key tiles, gradients added to what
// dq, dk, dv hold; then with packed documents (of 1 token, across tile boundaries, of one tile).
TEST_CASE("grouped-query attention in place and packed: CUDA twin matches the CPU twin",
          "[cuda][llama]") {
  const auto docs = test::pack_documents({{1, 70, 1, 120}, {64, 100, 28}}, 192).doc_start;
  for (bool packed : {false, true}) {
    KernelOptions options = test::own_attention_kernels();
    options.cuda_fused_attention = FusedAttention::kAll;  // whatever ZRT_CUDA_ATTENTION says
    options.cuda_gqa_packed = packed;
    for (int HS : {64, 128}) {
      for (auto [NH, NKV] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}, std::pair{8, 1}}) {
        const std::string what = std::string(packed ? "packed" : "in place") +
                                 " gqa attention (hs " + std::to_string(HS) + ", " +
                                 std::to_string(NH) + "/" + std::to_string(NKV) + " heads, T 192)";
        parity(
            what,
            [&](Backend& be, DType dt, DType) {
              return run_gqa(be, dt, 2, 192, NH, NKV, HS, kSeed + 6 + HS + NH * 10 + NKV, {}, true);
            },
            options);
        parity(
            what + " with documents",
            [&](Backend& be, DType dt, DType) {
              return run_gqa(be, dt, 2, 192, NH, NKV, HS, kSeed + 7 + HS + NH * 10 + NKV, docs,
                             true);
            },
            options);
        // Sliding windows (kernels/ops.h): 37 tokens, alone and with the documents, so window
        // edges fall inside key tiles and mix with document edges.
        parity(
            what + " with a window",
            [&](Backend& be, DType dt, DType) {
              return run_gqa(be, dt, 2, 192, NH, NKV, HS, kSeed + 8 + HS + NH * 10 + NKV, {}, true,
                             GradWrite::kAccumulate, 37);
            },
            options);
        parity(
            what + " with documents and a window",
            [&](Backend& be, DType dt, DType) {
              return run_gqa(be, dt, 2, 192, NH, NKV, HS, kSeed + 9 + HS + NH * 10 + NKV, docs,
                             true, GradWrite::kAccumulate, 100);
            },
            options);
      }
    }
  }
}

// Grouped-query attention in place on the pipelined mma kernels (KernelOptions::
// cuda_attention_pipelined) gives the staged kernels' bits: the same products in the same order,
// each key/value head read for its group from the pipelined tiles, dK/dV summed over the group
// as the tiles of (query head, query tile) pass through the two buffers. Groups 1, 2, 4 and 8 at
// head sizes 64 and 128, with and without documents, gradients added to what dq, dk, dv hold.
TEST_CASE("grouped-query attention in place, pipelined: the staged kernels' bits",
          "[cuda][llama]") {
  const auto docs = test::pack_documents({{1, 70, 1, 120}, {64, 100, 28}}, 192).doc_start;
  KernelOptions staged_options = test::own_attention_kernels();
  staged_options.cuda_fused_attention = FusedAttention::kAll;  // whatever ZRT_CUDA_ATTENTION says
  staged_options.cuda_attention_pipelined = false;
  KernelOptions pipelined_options = staged_options;
  pipelined_options.cuda_attention_pipelined = true;
  for (int HS : {64, 128}) {
    for (auto [NH, NKV] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}, std::pair{8, 1}}) {
      // none, documents, documents and a 37-token window, the window alone (the pipelined dK/dV
      // kernel then stores each query's first key itself, with no doc_start to copy from)
      for (const int mask : {0, 1, 2, 3}) {
        const bool documents = mask == 1 || mask == 2;
        const int window = mask >= 2 ? 37 : 0;
        for (const DType dt : {DType::kBFloat16, DType::kFloat16}) {
          INFO("hs " << HS << ", " << NH << "/" << NKV << " heads"
                     << (documents ? ", documents, " : ", ") << "window " << window << ", "
                     << dtype_name(dt));
          REQUIRE(cuda::gqa_runs_in_place(cuda::attention_kernels(pipelined_options), dt, 192, NH,
                                          NKV, HS));
          Backend staged(DeviceType::kCuda, staged_options);
          Backend pipelined(DeviceType::kCuda, pipelined_options);
          const std::uint64_t seed = kSeed + 9 + HS + NH * 10 + NKV;
          const auto& ds = documents ? docs : std::vector<std::int32_t>{};
          const auto outputs = run_gqa(staged, dt, 2, 192, NH, NKV, HS, seed, ds, true,
                                       GradWrite::kAccumulate, window);
          run_gqa(pipelined, dt, 2, 192, NH, NKV, HS, seed, ds, true, GradWrite::kAccumulate,
                  window);
          for (const auto& [name, n] : outputs) {
            INFO(name);
            CHECK(pipelined.get(name, n) == staged.get(name, n));
          }
        }
      }
    }
  }
}

// Grouped-query attention on cuDNN's fused attention (KernelOptions::cuda_attention_cudnn):
// q, k, v read where the model keeps them, groups 1, 2, 4 and 8 at head sizes 64 and 128, a T
// that is a multiple of 64 and one that is not, gradients added to what dq, dk, dv hold and
// written in place into zeros (GradWrite::kIntoZeros), with the deterministic backward and the
// atomic one; parity's tolerances (fp32 calls are not
// cuDNN's: they run zrt's kernels). The counters prove cuDNN ran the bf16 calls.
TEST_CASE("grouped-query attention on cuDNN: CUDA matches the CPU twin", "[cuda][llama][cudnn]") {
  if (!cuda::cudnn_attention_built()) {  // the stand-ins: the option is refused, naming why
    WARN("cuDNN attention not built: " << cuda::cudnn_attention_missing_reason());
    KernelOptions options = test::cudnn_attention_kernels();
    REQUIRE_THROWS_WITH(Backend(DeviceType::kCuda, options),
                        Catch::Contains(cuda::cudnn_attention_missing_reason()));
    return;
  }
  for (const bool deterministic : {true, false}) {
    KernelOptions options = test::cudnn_attention_kernels();
    options.cuda_attention_cudnn_deterministic = deterministic;
    for (int HS : {64, 128}) {
      for (auto [NH, NKV] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}, std::pair{8, 1}}) {
        for (int T : {192, 200}) {
          const std::string what = std::string("cuDNN gqa attention (") +
                                   (deterministic ? "deterministic" : "non-deterministic") +
                                   ", hs " + std::to_string(HS) + ", " + std::to_string(NH) + "/" +
                                   std::to_string(NKV) + " heads, T " + std::to_string(T) + ")";
          const std::uint64_t seed = kSeed + 11 + HS + NH * 10 + NKV + T;
          parity(
              what,
              [&](Backend& be, DType dt, DType) {
                return run_gqa(be, dt, 2, T, NH, NKV, HS, seed, {}, true);
              },
              options);
          // Into zeroed gradients with the models' promise (GradWrite::kIntoZeros): cuDNN
          // writes dq, dk, dv in place.
          parity(
              what + " into zeros",
              [&](Backend& be, DType dt, DType) {
                return run_gqa(be, dt, 2, T, NH, NKV, HS, seed, {}, false, GradWrite::kIntoZeros);
              },
              options);
          // Overwritten from gradients that hold other values: cuDNN writes them in place, the
          // CPU twin zeroes first; an accumulation would add the start to one side only.
          parity(
              what + " overwritten",
              [&](Backend& be, DType dt, DType) {
                return run_gqa(be, dt, 2, T, NH, NKV, HS, seed, {}, true, GradWrite::kOverwrite);
              },
              options);
          Backend gpu(DeviceType::kCuda, options);
          run_gqa(gpu, DType::kBFloat16, 2, T, NH, NKV, HS, seed, {}, true);
          run_gqa(gpu, DType::kBFloat16, 2, T, NH, NKV, HS, seed, {}, false, GradWrite::kIntoZeros);
          run_gqa(gpu, DType::kBFloat16, 2, T, NH, NKV, HS, seed, {}, true, GradWrite::kOverwrite);
          INFO(what);
          CHECK(gpu.ctx->cuda()->cudnn_attention_forwards == 3);
          CHECK(gpu.ctx->cuda()->cudnn_attention_backwards == 3);
          // A sliding window of 37 tokens (cuDNN's diagonal band left bound): the CPU twin's
          // window, on cuDNN (counted), not handed back to zrt's kernels.
          parity(
              what + " window 37",
              [&](Backend& be, DType dt, DType) {
                return run_gqa(be, dt, 2, T, NH, NKV, HS, seed + 1, {}, true,
                               GradWrite::kAccumulate, 37);
              },
              options);
          Backend windowed(DeviceType::kCuda, options);
          run_gqa(windowed, DType::kBFloat16, 2, T, NH, NKV, HS, seed + 1, {}, true,
                  GradWrite::kAccumulate, 37);
          CHECK(windowed.ctx->cuda()->cudnn_attention_forwards == 1);
          CHECK(windowed.ctx->cuda()->cudnn_attention_backwards == 1);
        }
      }
    }
  }
}

// Grouped-query attention in place with a workspace limit its deterministic backward passes
// (1 KiB: cuDNN's forward asks for 256 bytes, its backward for far more, zrt's in-place kernels
// for their 6 KiB row term): cuDNN's forward, then zrt's kernels' backward from its
// log-sum-exp, the hand-over a Llama-3.1-8B run makes past ~11.5K tokens under the default
// limit; parity's tolerances, the counters saying who ran what.
TEST_CASE("grouped-query attention on cuDNN leaves a backward over its limit to zrt's kernels",
          "[cuda][llama][cudnn]") {
  if (!cuda::cudnn_attention_built()) {
    WARN("cuDNN attention not built: " << cuda::cudnn_attention_missing_reason());
    return;
  }
  KernelOptions options = test::cudnn_attention_kernels();
  options.cuda_attention_cudnn_workspace_limit = 1024;
  const std::uint64_t seed = kSeed + 31;
  const auto op = [&](Backend& be, DType dt, DType) {
    return run_gqa(be, dt, 2, 192, 4, 2, 128, seed, {}, false, GradWrite::kIntoZeros);
  };
  parity("gqa attention, backward over the limit (hs 128, 4/2 heads, T 192)", op, options);
  Backend gpu(DeviceType::kCuda, options);
  op(gpu, DType::kBFloat16, DType::kBFloat16);
  CHECK(gpu.ctx->cuda()->cudnn_attention_forwards == 1);
  CHECK(gpu.ctx->cuda()->cudnn_attention_backwards == 0);
}

TEST_CASE("tiny Llama, Qwen2 and Qwen3 on the GPU match transformers (fp32)", "[cuda][llama]") {
  std::vector<nlohmann::json> cases = test::llama_golden()["cases"];
  for (const auto& g : test::qwen3_golden()["cases"]) cases.push_back(g);  // q_norm / k_norm
  for (const auto& g : cases) {
    const llama::LlamaConfig config = test::case_config(g);
    for (bool checkpointing : {false, true}) {
      // The loss and every gradient of the golden batch (its sequences swapped with `swap`: the
      // tolerances, llama_golden.h's gradient_tolerance).
      auto run = [&](bool swap, double* loss) {
        Backend gpu(DeviceType::kCuda);
        llama::Llama model(config, *gpu.ctx, llama::LlamaOptions{checkpointing});
        FlatParamAccess access(*gpu.device, *gpu.stream, model.parameters(), model.num_modules(),
                               DType::kFloat32, DType::kFloat32);
        const auto& params = model.parameters();
        for (int i = 0; i < static_cast<int>(params.size()); ++i) {
          access.set_param(i,
                           test::golden_weights(params[i].name, i, params[i].numel(), g["seed"]));
        }
        const auto [tok, tgt] = test::golden_batch(g, swap);
        Buffer tok_buf = gpu.device->allocate(static_cast<std::int64_t>(tok.size() * 4),
                                              MemCategory::kOther, "tokens");
        Buffer tgt_buf = gpu.device->allocate(static_cast<std::int64_t>(tgt.size() * 4),
                                              MemCategory::kOther, "targets");
        gpu.device->copy_to_device(tok_buf.device<std::byte>(), tok.data(), tok.size() * 4,
                                   *gpu.stream);
        gpu.device->copy_to_device(tgt_buf.device<std::byte>(), tgt.data(), tgt.size() * 4,
                                   *gpu.stream);
        const TokenBatch batch{tok_buf.device<const std::int32_t>(),
                               tgt_buf.device<const std::int32_t>(), g["B"], g["T"]};
        model.forward_backward(access, batch, 1.0f);
        *loss = model.read_loss();
        std::vector<std::vector<float>> grads;
        for (int i = 0; i < static_cast<int>(params.size()); ++i) {
          grads.push_back(access.read_grad(i));
        }
        gpu.stream->synchronize();
        return std::make_pair(params, grads);
      };
      double loss = 0, swapped_loss = 0;
      const auto [params, grads] = run(false, &loss);
      const auto swapped = run(true, &swapped_loss).second;
      const double want = g["loss"];
      INFO(g["label"].get<std::string>() << " checkpointing " << checkpointing);
      CHECK(std::abs(loss - want) / want <= 1e-5);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto golden = test::golden_tensor(g["grads"][params[i].name]);
        const double err = test::rel_error(grads[i], golden);
        const double tolerance = test::gradient_tolerance(grads[i], swapped[i]);
        INFO(params[i].name << ": relative error " << err << ", tolerance " << tolerance);
        CHECK(err <= tolerance);
      }
    }
  }
}

// ---- Packed documents ----

// RoPE by each token's position in its document (positions[b*T+t]): sequence 0 holds documents of
// 1, 40 and 39 tokens, sequence 1 one of 80 (positions 0..79, the unpacked rotation).
TEST_CASE("rope with positions: CUDA twin matches the CPU twin", "[cuda][llama][docs]") {
  const auto positions = test::pack_documents({{1, 40, 39}, {80}}, kT).positions;
  parity("rope (positions)", [&](Backend& be, DType dt, DType) {
    const RopeTable table = make_rope_table(kHS, 10000.0, {});
    const std::size_t n = std::size_t{kN} * kNH * kHS;
    const Bytes x = be.put("x", normal_values(kSeed, 23, n), dt);
    const Bytes out = be.put("out", Vec(n, 0.0), dt);
    const Bytes d = be.put("d", normal_values(kSeed, 24, n), dt);
    const ConstTokens pos = be.put_ids("positions", positions);
    rope_forward(*be.ctx, dt, out, x, table, kB, kT, kNH, kHS, pos);
    rope_backward(*be.ctx, dt, d, d, table, kB, kT, kNH, kHS, pos);  // in place
    return std::map<std::string, std::size_t>{{"out", n}, {"d", n}};
  });
}

// Grouped-query attention with packed documents through the packed attention: at kT = 80 the
// batched path (scores outside the documents masked), at T = 128 the fused kernels for bf16 with
// head sizes 64 and 128 (their key and query tiles skipped outside the documents). Documents of 1
// token, across the 64-token tile boundary, and of exactly one tile.
TEST_CASE("grouped-query attention with packed documents: CUDA twin matches the CPU twin",
          "[cuda][llama][docs]") {
  parity("gqa attention (documents, T 80)", [](Backend& be, DType dt, DType) {
    return run_gqa(be, dt, kB, kT, kNH, kNKV, kHS, kSeed + 3,
                   test::pack_documents({{1, 40, 39}, {10, 70}}, kT).doc_start);
  });
  const auto docs128 = test::pack_documents({{1, 70, 1, 56}, {64, 64}}, 128).doc_start;
  parity("gqa attention (documents, hs 64, T 128)", [&](Backend& be, DType dt, DType) {
    return run_gqa(be, dt, 2, 128, 4, 2, 64, kSeed + 4, docs128);
  });
  parity("gqa attention (documents, hs 128, T 128)", [&](Backend& be, DType dt, DType) {
    return run_gqa(be, dt, 2, 128, 4, 1, 128, kSeed + 5, docs128);
  });
}

// Sliding windows through the batched path (T 80: scores before the window masked) and the fused
// kernels (T 128, head sizes 64 and 128: key and query tiles before it skipped), alone and with
// packed documents; windows of 2 tokens (a query and the key before it) and of 17 and 70 tokens.
// (Not 1: each query then sees only itself, its probability is 1 and dq, dk are zero in exact
// arithmetic, so their relative error compares rounding residues.)
TEST_CASE("grouped-query attention with a sliding window: CUDA twin matches the CPU twin",
          "[cuda][llama][window]") {
  const auto docs80 = test::pack_documents({{1, 40, 39}, {10, 70}}, kT).doc_start;
  const auto docs128 = test::pack_documents({{1, 70, 1, 56}, {64, 64}}, 128).doc_start;
  for (const int window : {2, 17, 70}) {
    const std::string w = " window " + std::to_string(window);
    parity("gqa attention (T 80," + w + ")", [&](Backend& be, DType dt, DType) {
      return run_gqa(be, dt, kB, kT, kNH, kNKV, kHS, kSeed + 10 + window, {}, false,
                     GradWrite::kAccumulate, window);
    });
    parity("gqa attention (documents, T 80," + w + ")", [&](Backend& be, DType dt, DType) {
      return run_gqa(be, dt, kB, kT, kNH, kNKV, kHS, kSeed + 11 + window, docs80, false,
                     GradWrite::kAccumulate, window);
    });
    parity("gqa attention (hs 64, T 128," + w + ")", [&](Backend& be, DType dt, DType) {
      return run_gqa(be, dt, 2, 128, 4, 2, 64, kSeed + 12 + window, {}, false,
                     GradWrite::kAccumulate, window);
    });
    parity("gqa attention (documents, hs 128, T 128," + w + ")", [&](Backend& be, DType dt, DType) {
      return run_gqa(be, dt, 2, 128, 4, 1, 128, kSeed + 13 + window, docs128, false,
                     GradWrite::kAccumulate, window);
    });
  }
}

}  // namespace
}  // namespace zrt::kernels
