// GPU parity: every CUDA kernel (through ops.h on a CUDA KernelContext) against its CPU twin on
// the same inputs, in fp32 (per-tensor relative error <= 1e-5) and with bf16 storage (<= 1e-2,
// fp32 and bf16 gradients); the cuBLASLt bias-epilogue path against its fallback; determinism
// of the backward passes; packed documents (doc_start, positions, targets < 0); and the whole
// tiny GPT on the GPU against the PyTorch golden values.
// Listed everywhere, skipped (exit 77) without a usable GPU (tests/support/gpu_test_main.cc).
#include <catch2/catch.hpp>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "models/flat_param_access.h"
#include "models/gpt/gpt.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/support/gpu_test_support.h"

namespace zrt::kernels {
namespace {

using test::decode;
using test::encode;
using test::normal_values;
using test::to_double;
using test::to_storage;
using Vec = std::vector<double>;
using Results = std::map<std::string, Vec>;

constexpr std::uint64_t kSeed = 99;
// Shapes with several thread blocks, row chunks and GEMM tiles per dimension.
constexpr int kB = 2, kT = 64, kC = 128, kNH = 4, kV = 1000;
constexpr int kN = kB * kT;

// A CUDA device, stream and kernel context, with host<->device helpers (synchronous).
struct Gpu {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<KernelContext> ctx;

  explicit Gpu(KernelOptions kernel_options = test::own_attention_kernels()) {
    DeviceOptions options;
    options.type = DeviceType::kCuda;
    options.index = test::gpu_index();
    device = make_device(options);
    stream = device->create_stream("compute");
    ctx = std::make_unique<KernelContext>(*device, *stream, kernel_options);
  }
  Buffer upload_bytes(const void* data, std::size_t bytes) {
    Buffer b = device->allocate(static_cast<std::int64_t>(bytes + 64), MemCategory::kOther, "test");
    device->copy_to_device(b.device<std::byte>(), data, bytes, *stream);
    stream->synchronize();
    return b;
  }
  Buffer upload(const Vec& v, DType dt) {
    const auto bytes = encode(v, dt);
    return upload_bytes(bytes.data(), bytes.size());
  }
  Buffer zeros(std::size_t n, DType dt) { return upload(Vec(n, 0.0), dt); }
  Buffer tokens(const std::vector<std::int32_t>& t) {
    return upload_bytes(t.data(), t.size() * sizeof(std::int32_t));
  }
  Vec download(const Buffer& b, std::size_t n, DType dt) {
    std::vector<std::byte> bytes(n * dtype_size(dt));
    device->copy_to_host(bytes.data(), b.device<std::byte>(), bytes.size(), *stream);
    stream->synchronize();
    return decode(bytes, dt);
  }
};

Bytes dev(const Buffer& b) {
  return b.device<std::byte>();
}
Floats fdev(const Buffer& b) {
  return b.device<float>();
}
ConstTokens tdev(const Buffer& b) {
  return b.device<const std::int32_t>();
}

void compare(const Results& gpu, const Results& cpu, double tol) {
  for (const auto& [name, want] : cpu) {
    REQUIRE(gpu.count(name) == 1);
    const double err = test::rel_error(gpu.at(name), want);
    INFO(name << ": GPU vs CPU twin relative error " << err << " (tolerance " << tol << ")");
    CHECK(err <= tol);
  }
}

// ---- per layer: CPU twin (storage S, gradients G) and the GPU op (dtype dt, grads gt) ----------

struct EncoderIn {
  Vec wte = normal_values(kSeed, 1, kV*kC), wpe = normal_values(kSeed, 2, kT*kC),
      dout = normal_values(kSeed, 3, kN*kC);
  std::vector<std::int32_t> tokens = [] {
    auto t = test::token_values(kSeed, 4, kN, 16);  // a small range: many repeated tokens
    t[5] = kV - 1;
    return t;
  }();
  std::vector<std::int32_t> positions;  // empty: none (position t)
  const std::int32_t* pos() const { return positions.empty() ? nullptr : positions.data(); }
};

template <typename S, typename G>
Results cpu_encoder(const EncoderIn& in) {
  const auto wte = to_storage<S>(in.wte), wpe = to_storage<S>(in.wpe),
             dout = to_storage<S>(in.dout);
  std::vector<S> out(kN * kC);
  std::vector<G> dwte(wte.size(), G{}), dwpe(wpe.size(), G{});
  cpu::encoder_forward<S>(out.data(), in.tokens.data(), wte.data(), wpe.data(), kB, kT, kC, kV,
                          in.pos());
  cpu::encoder_backward<S, G>(dwte.data(), dwpe.data(), dout.data(), in.tokens.data(), kB, kT, kC,
                              kV, in.pos());
  return {{"out", to_double(out)}, {"dwte", to_double(dwte)}, {"dwpe", to_double(dwpe)}};
}

Results gpu_encoder(Gpu& g, DType dt, DType gt, const EncoderIn& in) {
  Buffer wte = g.upload(in.wte, dt), wpe = g.upload(in.wpe, dt), dout = g.upload(in.dout, dt);
  Buffer tok = g.tokens(in.tokens);
  Buffer out = g.zeros(kN * kC, dt), dwte = g.zeros(in.wte.size(), gt),
         dwpe = g.zeros(in.wpe.size(), gt);
  Buffer pos = g.tokens(in.positions.empty() ? std::vector<std::int32_t>{0} : in.positions);
  const ConstTokens positions = in.positions.empty() ? ConstTokens{} : tdev(pos);
  encoder_forward(*g.ctx, dt, dev(out), tdev(tok), dev(wte), dev(wpe), kB, kT, kC, kV, positions);
  encoder_backward(*g.ctx, dt, gt, dev(dwte), dev(dwpe), dev(dout), tdev(tok), kB, kT, kC, kV,
                   positions);
  return {{"out", g.download(out, kN * kC, dt)},
          {"dwte", g.download(dwte, in.wte.size(), gt)},
          {"dwpe", g.download(dwpe, in.wpe.size(), gt)}};
}

struct LayerNormIn {
  int N = kN, C = kC;
  Vec x = normal_values(kSeed, 11, kN*kC, 2.0, 0.5), w = normal_values(kSeed, 12, kC, 0.1, 1.0),
      b = normal_values(kSeed, 13, kC, 0.1), dout = normal_values(kSeed, 14, kN*kC);
  LayerNormIn() = default;
  LayerNormIn(int n, int c)
      : N(n),
        C(c),
        x(normal_values(kSeed, 15, n * c, 2.0, 0.5)),
        w(normal_values(kSeed, 16, c, 0.1, 1.0)),
        b(normal_values(kSeed, 17, c, 0.1)),
        dout(normal_values(kSeed, 18, n * c)) {}
};

template <typename S, typename G>
Results cpu_layernorm(const LayerNormIn& in) {
  const int N = in.N, C = in.C;
  const auto x = to_storage<S>(in.x), w = to_storage<S>(in.w), b = to_storage<S>(in.b),
             dout = to_storage<S>(in.dout);
  std::vector<S> out(N * C), dx(N * C, S{});
  std::vector<float> mean(N), rstd(N);
  std::vector<G> dw(C, G{}), db(C, G{});
  cpu::layernorm_forward<S>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                            C);
  cpu::layernorm_backward<S, G>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                                mean.data(), rstd.data(), N, C);
  return {{"out", to_double(out)}, {"mean", to_double(mean)},  {"rstd", to_double(rstd)},
          {"dinp", to_double(dx)}, {"dweight", to_double(dw)}, {"dbias", to_double(db)}};
}

Results gpu_layernorm(Gpu& g, DType dt, DType gt, const LayerNormIn& in) {
  const int N = in.N, C = in.C;
  Buffer x = g.upload(in.x, dt), w = g.upload(in.w, dt), b = g.upload(in.b, dt),
         dout = g.upload(in.dout, dt);
  Buffer out = g.zeros(N * C, dt), dx = g.zeros(N * C, dt);
  Buffer mean = g.zeros(N, DType::kFloat32), rstd = g.zeros(N, DType::kFloat32);
  Buffer dw = g.zeros(C, gt), db = g.zeros(C, gt);
  layernorm_forward(*g.ctx, dt, dev(out), fdev(mean), fdev(rstd), dev(x), dev(w), dev(b), N, C);
  layernorm_backward(*g.ctx, dt, gt, dev(dx), dev(dw), dev(db), dev(dout), dev(x), dev(w),
                     fdev(mean), fdev(rstd), N, C);
  return {{"out", g.download(out, N * C, dt)},
          {"mean", g.download(mean, N, DType::kFloat32)},
          {"rstd", g.download(rstd, N, DType::kFloat32)},
          {"dinp", g.download(dx, N * C, dt)},
          {"dweight", g.download(dw, C, gt)},
          {"dbias", g.download(db, C, gt)}};
}

struct MatmulIn {
  int N, C, OC;
  Vec x, w, b, dout;
  MatmulIn(int n, int c, int oc)
      : N(n),
        C(c),
        OC(oc),
        x(normal_values(kSeed, 21, n * c)),
        w(normal_values(kSeed, 22, c * oc, 0.05)),
        b(normal_values(kSeed, 23, oc, 0.1)),
        dout(normal_values(kSeed, 24, n * oc)) {}
};

template <typename S, typename G>
Results cpu_matmul(const MatmulIn& in) {
  const auto x = to_storage<S>(in.x), w = to_storage<S>(in.w), b = to_storage<S>(in.b),
             dout = to_storage<S>(in.dout);
  std::vector<S> out(in.N * in.OC), dx(in.N * in.C, S{});
  std::vector<G> dw(in.C * in.OC, G{}), db(in.OC, G{});
  std::vector<float> ws(std::max(cpu::matmul_forward_workspace<S>(in.N, in.C, in.OC),
                                 cpu::matmul_backward_workspace<S>(in.N, in.C, in.OC)) +
                        1);
  cpu::matmul_forward<S>(out.data(), x.data(), w.data(), b.data(), in.N, in.C, in.OC, ws.data());
  cpu::matmul_backward<S, G>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), in.N,
                             in.C, in.OC, ws.data());
  return {{"out", to_double(out)},
          {"dinp", to_double(dx)},
          {"dweight", to_double(dw)},
          {"dbias", to_double(db)}};
}

// bias_offset > 0 misaligns the bias pointer, which sends the forward to the fallback path.
Results gpu_matmul(Gpu& g, DType dt, DType gt, const MatmulIn& in, int bias_offset = 0) {
  Buffer x = g.upload(in.x, dt), w = g.upload(in.w, dt), dout = g.upload(in.dout, dt);
  Vec padded(bias_offset, 0.0);
  padded.insert(padded.end(), in.b.begin(), in.b.end());
  Buffer b = g.upload(padded, dt);
  Buffer out = g.zeros(in.N * in.OC, dt), dx = g.zeros(in.N * in.C, dt);
  Buffer dw = g.zeros(in.C * in.OC, gt), db = g.zeros(in.OC, gt);
  const Bytes bias = dev(b) + bias_offset * static_cast<std::int64_t>(dtype_size(dt));
  matmul_forward(*g.ctx, dt, dev(out), dev(x), dev(w), bias, in.N, in.C, in.OC);
  matmul_backward(*g.ctx, dt, gt, dev(dx), dev(dw), dev(db), dev(dout), dev(x), dev(w), in.N, in.C,
                  in.OC);
  return {{"out", g.download(out, in.N * in.OC, dt)},
          {"dinp", g.download(dx, in.N * in.C, dt)},
          {"dweight", g.download(dw, in.C * in.OC, gt)},
          {"dbias", g.download(db, in.OC, gt)}};
}

struct ElementwiseIn {
  int n = kN * 4 * kC;
  Vec x = normal_values(kSeed, 31, n, 2.0), y = normal_values(kSeed, 32, n),
      dout = normal_values(kSeed, 33, n);
};

template <typename S, typename G>
Results cpu_elementwise(const ElementwiseIn& in) {
  const auto x = to_storage<S>(in.x), y = to_storage<S>(in.y), dout = to_storage<S>(in.dout);
  std::vector<S> gelu(in.n), dgelu(in.n, S{}), sum(in.n), da(in.n, S{}), db(in.n, S{});
  cpu::gelu_forward<S>(gelu.data(), x.data(), in.n);
  cpu::gelu_backward<S>(dgelu.data(), x.data(), dout.data(), in.n);
  cpu::residual_forward<S>(sum.data(), x.data(), y.data(), in.n);
  cpu::residual_backward<S>(da.data(), db.data(), dout.data(), in.n);
  return {{"gelu", to_double(gelu)},
          {"dgelu", to_double(dgelu)},
          {"sum", to_double(sum)},
          {"da", to_double(da)},
          {"db", to_double(db)}};
}

Results gpu_elementwise(Gpu& g, DType dt, DType /*gt*/, const ElementwiseIn& in) {
  Buffer x = g.upload(in.x, dt), y = g.upload(in.y, dt), dout = g.upload(in.dout, dt);
  Buffer gelu = g.zeros(in.n, dt), dgelu = g.zeros(in.n, dt), sum = g.zeros(in.n, dt),
         da = g.zeros(in.n, dt), db = g.zeros(in.n, dt);
  gelu_forward(*g.ctx, dt, dev(gelu), dev(x), in.n);
  gelu_backward(*g.ctx, dt, dev(dgelu), dev(x), dev(dout), in.n);
  residual_forward(*g.ctx, dt, dev(sum), dev(x), dev(y), in.n);
  residual_backward(*g.ctx, dt, dev(da), dev(db), dev(dout), in.n);
  return {{"gelu", g.download(gelu, in.n, dt)},
          {"dgelu", g.download(dgelu, in.n, dt)},
          {"sum", g.download(sum, in.n, dt)},
          {"da", g.download(da, in.n, dt)},
          {"db", g.download(db, in.n, dt)}};
}

struct AttentionIn {
  int B = kB, T = kT, C = kC, NH = kNH;
  Vec qkv = normal_values(kSeed, 51, kN * 3 * kC), dout = normal_values(kSeed, 52, kN*kC);
  std::vector<std::int32_t> doc_start;  // packed documents (B,T); empty: none
  int window = 0;                       // sliding window (kernels/ops.h); 0: none
  AttentionIn() = default;
  AttentionIn(int b, int t, int c, int nh)
      : B(b),
        T(t),
        C(c),
        NH(nh),
        qkv(normal_values(kSeed, 53, b * t * 3 * c)),
        dout(normal_values(kSeed, 54, b * t * c)) {}
  std::size_t rows() const { return static_cast<std::size_t>(B) * NH * T; }
  const std::int32_t* docs() const { return doc_start.empty() ? nullptr : doc_start.data(); }
};

template <typename S, typename G>
Results cpu_attention(const AttentionIn& in) {
  const auto qkv = to_storage<S>(in.qkv), dout = to_storage<S>(in.dout);
  std::vector<S> out(in.dout.size()), dqkv(qkv.size(), S{});
  std::vector<float> lse(in.rows());
  std::vector<float> ws(std::max(cpu::attention_forward_workspace<S>(in.B, in.T, in.C, in.NH),
                                 cpu::attention_backward_workspace<S>(in.B, in.T, in.C, in.NH)) +
                        1);
  cpu::attention_forward<S>(out.data(), lse.data(), qkv.data(), in.B, in.T, in.C, in.NH, ws.data(),
                            in.docs(), in.window);
  cpu::attention_backward<S>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), in.B,
                             in.T, in.C, in.NH, ws.data(), in.docs(), in.window);
  return {{"out", to_double(out)}, {"lse", to_double(lse)}, {"dqkv", to_double(dqkv)}};
}

// dqkv_write: how the backward writes dqkv, which starts at zeros, or at NaN for kOverwrite (a
// value it must not read).
Results gpu_attention_written(Gpu& g, DType dt, const AttentionIn& in, GradWrite dqkv_write) {
  Buffer qkv = g.upload(in.qkv, dt), dout = g.upload(in.dout, dt);
  Buffer out = g.zeros(in.dout.size(), dt),
         dqkv = g.upload(
             Vec(in.qkv.size(), dqkv_write == GradWrite::kOverwrite ? std::nan("") : 0.0), dt),
         lse = g.zeros(in.rows(), DType::kFloat32);
  Buffer ds = g.tokens(in.doc_start.empty() ? std::vector<std::int32_t>{0} : in.doc_start);
  const ConstTokens doc_start = in.doc_start.empty() ? ConstTokens{} : tdev(ds);
  attention_forward(*g.ctx, dt, dev(out), fdev(lse), dev(qkv), in.B, in.T, in.C, in.NH, doc_start,
                    in.window);
  attention_backward(*g.ctx, dt, dev(dqkv), dev(dout), dev(qkv), dev(out), fdev(lse), in.B, in.T,
                     in.C, in.NH, doc_start, in.window, dqkv_write);
  return {{"out", g.download(out, in.dout.size(), dt)},
          {"lse", g.download(lse, in.rows(), DType::kFloat32)},
          {"dqkv", g.download(dqkv, in.qkv.size(), dt)}};
}
Results gpu_attention(Gpu& g, DType dt, DType /*gt*/, const AttentionIn& in) {
  return gpu_attention_written(g, dt, in, GradWrite::kAccumulate);
}

struct HeadIn {
  explicit HeadIn(int vocab = kV) : V(vocab) {}
  int V;  // kV, or one that is not a multiple of the 16-byte packs (the GPT-2 vocabulary's case)
  Vec x = normal_values(kSeed, 61, kN*kC), wte = normal_values(kSeed, 62, std::size_t(V) * kC, 0.1);
  std::vector<std::int32_t> targets = test::token_values(kSeed, 63, kN, V);  // < 0: no loss
  float divisor = 0.0f;                                                      // loss_mean's
};

// logits, losses and mean loss, then the in-place cross-entropy gradient and the head backward.
template <typename S, typename G>
Results cpu_head(const HeadIn& in) {
  const int V = in.V;
  const auto x = to_storage<S>(in.x), wte = to_storage<S>(in.wte);
  std::vector<S> logits(kN * V), dx(kN * kC, S{});
  std::vector<G> dwte(wte.size(), G{});
  std::vector<float> losses(kN), mean(1);
  std::vector<float> ws(std::max(cpu::logits_forward_workspace<S>(kN, kC, V),
                                 cpu::logits_backward_workspace<S>(kN, kC, V)) +
                        1);
  cpu::logits_forward<S>(logits.data(), x.data(), wte.data(), kN, kC, V, ws.data());
  const Vec logits_fwd = to_double(logits);
  cpu::crossentropy_forward<S>(losses.data(), logits.data(), in.targets.data(), kN, V);
  cpu::loss_mean<float>(mean.data(), losses.data(), kN, in.divisor);
  cpu::crossentropy_backward<S>(logits.data(), logits.data(), in.targets.data(), 1.0f / kN, kN, V);
  cpu::logits_backward<S, G>(dx.data(), dwte.data(), logits.data(), x.data(), wte.data(), kN, kC, V,
                             ws.data());
  return {{"logits", logits_fwd},         {"losses", to_double(losses)}, {"mean", to_double(mean)},
          {"dlogits", to_double(logits)}, {"dinp", to_double(dx)},       {"dwte", to_double(dwte)}};
}

// The head, logits in rows of logits_row_stride(kV) (or `ld`). The buffer starts as NaN, so a
// padding column read before it is written would spoil a result; after the cross-entropy
// gradient the padding must hold zeros (the contract in kernels/ops.h; logits_backward reads
// only the first V columns). `fused`: the
// losses and the gradient from crossentropy_forward_backward, as the models' training step
// takes them; else from crossentropy_forward and crossentropy_backward.
Results gpu_head(Gpu& g, DType dt, DType gt, const HeadIn& in, int ld = 0, bool fused = true) {
  const int V = in.V;
  if (ld == 0) ld = logits_row_stride(V);
  const std::size_t padded = static_cast<std::size_t>(kN) * ld;
  Buffer x = g.upload(in.x, dt), wte = g.upload(in.wte, dt), tgt = g.tokens(in.targets);
  Buffer logits = g.upload(Vec(padded, std::nan("")), dt), dx = g.zeros(kN * kC, dt),
         dwte = g.zeros(in.wte.size(), gt);
  Buffer losses = g.zeros(kN, DType::kFloat32), mean = g.zeros(1, DType::kFloat32);
  auto dense = [&](const Vec& rows, bool zero_padding) {
    Vec out;
    for (int n = 0; n < kN; ++n) {
      for (int v = 0; v < ld; ++v) {
        const double x = rows[static_cast<std::size_t>(n) * ld + v];
        if (v < V) {
          out.push_back(x);
        } else if (zero_padding && x != 0.0) {
          FAIL("dlogits padding column " << v << " of row " << n << " is " << x << ", not 0");
        }
      }
    }
    return out;
  };
  logits_forward(*g.ctx, dt, dev(logits), dev(x), dev(wte), kN, kC, V, ld);
  const Vec logits_fwd = dense(g.download(logits, padded, dt), false);
  if (fused) {
    crossentropy_forward_backward(*g.ctx, dt, fdev(losses), dev(logits), dev(logits), tdev(tgt),
                                  1.0f / kN, kN, V, ld);
    loss_mean(*g.ctx, fdev(mean), fdev(losses), kN, in.divisor);
  } else {
    crossentropy_forward(*g.ctx, dt, fdev(losses), dev(logits), tdev(tgt), kN, V, ld);
    loss_mean(*g.ctx, fdev(mean), fdev(losses), kN, in.divisor);
    crossentropy_backward(*g.ctx, dt, dev(logits), dev(logits), tdev(tgt), 1.0f / kN, kN, V, ld);
  }
  logits_backward(*g.ctx, dt, gt, dev(dx), dev(dwte), dev(logits), dev(x), dev(wte), kN, kC, V, ld);
  return {{"logits", logits_fwd},
          {"losses", g.download(losses, kN, DType::kFloat32)},
          {"mean", g.download(mean, 1, DType::kFloat32)},
          {"dlogits", dense(g.download(logits, padded, dt), true)},
          {"dinp", g.download(dx, kN * kC, dt)},
          {"dwte", g.download(dwte, in.wte.size(), gt)}};
}

// Runs one layer's parity check in fp32, bf16 with fp32 gradients and bf16 with bf16 gradients.
template <typename In, typename CpuF32, typename CpuBf16F32, typename CpuBf16, typename GpuFn>
void check_layer(const In& in, CpuF32 cpu_f32, CpuBf16F32 cpu_bf16_f32, CpuBf16 cpu_bf16,
                 GpuFn gpu) {
  Gpu g;
  SECTION("fp32") {
    compare(gpu(g, DType::kFloat32, DType::kFloat32, in), cpu_f32(in), 1e-5);
  }
  SECTION("bf16, fp32 grads") {
    compare(gpu(g, DType::kBFloat16, DType::kFloat32, in), cpu_bf16_f32(in), 1e-2);
  }
  SECTION("bf16, bf16 grads") {
    compare(gpu(g, DType::kBFloat16, DType::kBFloat16, in), cpu_bf16(in), 1e-2);
  }
}

TEST_CASE("CUDA encoder matches its CPU twin", "[cuda]") {
  check_layer(EncoderIn{}, cpu_encoder<float, float>, cpu_encoder<bf16, float>,
              cpu_encoder<bf16, bf16>, gpu_encoder);
}

TEST_CASE("CUDA layernorm matches its CPU twin", "[cuda]") {
  check_layer(LayerNormIn{}, cpu_layernorm<float, float>, cpu_layernorm<bf16, float>,
              cpu_layernorm<bf16, bf16>, gpu_layernorm);
}

// The weight and bias gradients' column sums past CUDA's 65535 blocks in y: 65537 chunks of 64
// rows, the output gradient zero but in the last two chunks, which only the blocks' second stride
// reaches (a launch that dropped them gives zero gradients; one past the cap fails to launch, on
// the stand-ins too). Narrow rows: the row count is the point.
TEST_CASE("CUDA layernorm backward past 65535 row chunks matches its CPU twin", "[cuda]") {
  Gpu g;
  LayerNormIn in(65537 * 64, 2);
  std::fill(in.dout.begin(), in.dout.end() - 2 * 64 * 2, 0.0);
  compare(gpu_layernorm(g, DType::kFloat32, DType::kFloat32, in), cpu_layernorm<float, float>(in),
          1e-5);
}

// C = 768 (GPT-2 124M) and 1024 take the register-resident 16-bit kernels both ways (C a
// multiple of 256; the backward in one pass, its column sums 32 rows a chunk: 100 rows end in a
// partial chunk); 1600 (GPT-2 XL) and 4096 (a 6.7B GPT) the register-resident forward and the
// two-pass backward; the 16-bit tolerance as for every layer.
TEST_CASE("CUDA layernorm at GPT-2 widths matches its CPU twin", "[cuda]") {
  Gpu g;
  for (const auto& [N, C] : {std::pair{96, 768}, std::pair{100, 768}, std::pair{96, 1024},
                             std::pair{100, 1024}, std::pair{96, 1600}, std::pair{96, 4096}}) {
    const LayerNormIn in(N, C);
    INFO("N = " << N << ", C = " << C);
    compare(gpu_layernorm(g, DType::kBFloat16, DType::kFloat32, in), cpu_layernorm<bf16, float>(in),
            1e-2);
    compare(gpu_layernorm(g, DType::kBFloat16, DType::kBFloat16, in), cpu_layernorm<bf16, bf16>(in),
            1e-2);
    compare(gpu_layernorm(g, DType::kFloat16, DType::kFloat32, in), cpu_layernorm<fp16, float>(in),
            1e-2);
    CHECK(gpu_layernorm(g, DType::kBFloat16, DType::kFloat32, in) ==
          gpu_layernorm(g, DType::kBFloat16, DType::kFloat32, in));
  }
}

// residual + LayerNorm in one pass over each row (16-bit rows, C % 8 == 0, C <= 4096) against
// the CPU twins' composition: x = a + b (the residual stream, `res`) then layernorm(x). C = 100
// (not a multiple of 8) and fp32 take the two unfused kernels; 96 and 1600 leave lanes idle.
// Outputs start as NaN.
Results cpu_residual_layernorm(const LayerNormIn& in, DType dt) {
  auto run = [&](auto s) {
    using S = decltype(s);
    const auto a = to_storage<S>(in.x), b = to_storage<S>(in.dout), w = to_storage<S>(in.w),
               bias = to_storage<S>(in.b);
    std::vector<S> res(in.N * in.C), out(in.N * in.C);
    std::vector<float> mean(in.N), rstd(in.N);
    cpu::residual_forward<S>(res.data(), a.data(), b.data(), in.N * in.C);
    cpu::layernorm_forward<S>(out.data(), mean.data(), rstd.data(), res.data(), w.data(),
                              bias.data(), in.N, in.C);
    return Results{{"res", to_double(res)},
                   {"out", to_double(out)},
                   {"mean", to_double(mean)},
                   {"rstd", to_double(rstd)}};
  };
  return dt == DType::kFloat32 ? run(float{}) : run(bf16{});
}

Results gpu_residual_layernorm(Gpu& g, DType dt, const LayerNormIn& in) {
  Buffer a = g.upload(in.x, dt), b = g.upload(in.dout, dt), w = g.upload(in.w, dt),
         bias = g.upload(in.b, dt);
  const Vec nan(static_cast<std::size_t>(in.N) * in.C, std::nan(""));
  Buffer res = g.upload(nan, dt), out = g.upload(nan, dt);
  Buffer mean = g.upload(Vec(in.N, std::nan("")), DType::kFloat32),
         rstd = g.upload(Vec(in.N, std::nan("")), DType::kFloat32);
  residual_layernorm_forward(*g.ctx, dt, dev(res), dev(out), fdev(mean), fdev(rstd), dev(a), dev(b),
                             dev(w), dev(bias), in.N, in.C);
  return {{"res", g.download(res, in.N * in.C, dt)},
          {"out", g.download(out, in.N * in.C, dt)},
          {"mean", g.download(mean, in.N, DType::kFloat32)},
          {"rstd", g.download(rstd, in.N, DType::kFloat32)}};
}

TEST_CASE("CUDA residual + layernorm in one pass matches its CPU twins", "[cuda]") {
  Gpu g;
  for (int C : {768, 1024, 96, 1600, 4096, 100}) {
    const LayerNormIn in(96, C);
    INFO("C = " << C);
    compare(gpu_residual_layernorm(g, DType::kFloat32, in),
            cpu_residual_layernorm(in, DType::kFloat32), 1e-5);
    const Results bf = gpu_residual_layernorm(g, DType::kBFloat16, in);
    const Results want = cpu_residual_layernorm(in, DType::kBFloat16);
    compare(bf, want, 1e-2);
    // The residual stream itself is the same rounding of the same sum: exact.
    CHECK(bf.at("res") == want.at("res"));
  }
}

TEST_CASE("CUDA matmul matches its CPU twin", "[cuda]") {
  check_layer(MatmulIn(kN, kC, 3 * kC), cpu_matmul<float, float>, cpu_matmul<bf16, float>,
              cpu_matmul<bf16, bf16>, [](Gpu& g, DType dt, DType gt, const MatmulIn& in) {
                return gpu_matmul(g, dt, gt, in);
              });
}

TEST_CASE("CUDA matmul at GPT-2 124M shapes, cuBLASLt epilogue and fallback", "[cuda]") {
  const MatmulIn in(256, 768, 2304);
  Gpu g;
  compare(gpu_matmul(g, DType::kFloat32, DType::kFloat32, in), cpu_matmul<float, float>(in), 1e-5);
  // A bias at an odd element offset is not 16-byte aligned: the GemmEx + bias kernel path.
  compare(gpu_matmul(g, DType::kFloat32, DType::kFloat32, in, 1), cpu_matmul<float, float>(in),
          1e-5);
  compare(gpu_matmul(g, DType::kBFloat16, DType::kFloat32, in, 1), cpu_matmul<bf16, float>(in),
          1e-2);
}

// GradWrite::kOverwrite (beta 0) into a dinp full of NaN gives the bits of the default
// accumulation into zeros (beta 1: the same fp32 sum plus zero, rounded once), for both weight
// layouts; dweight and dbias accumulate either way.
TEST_CASE("CUDA matmul and linear backward overwrite dinp as accumulating into zeros does",
          "[cuda]") {
  const MatmulIn in(64, 96, 160);
  Gpu g;
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (bool linear : {false, true}) {
      INFO(dtype_name(dt) << (linear ? " linear_backward" : " matmul_backward"));
      Buffer x = g.upload(in.x, dt), w = g.upload(in.w, dt), dout = g.upload(in.dout, dt);
      auto run = [&](GradWrite mode, const Vec& dx_start) {
        Buffer dx = g.upload(dx_start, dt), dw = g.upload(in.w, dt), db = g.upload(in.b, dt);
        if (linear) {
          linear_backward(*g.ctx, dt, dt, dev(dx), dev(dw), dev(db), dev(dout), dev(x), dev(w),
                          in.N, in.C, in.OC, mode);
        } else {
          matmul_backward(*g.ctx, dt, dt, dev(dx), dev(dw), dev(db), dev(dout), dev(x), dev(w),
                          in.N, in.C, in.OC, mode);
        }
        return Results{{"dinp", g.download(dx, in.N * in.C, dt)},
                       {"dweight", g.download(dw, in.C * in.OC, dt)},
                       {"dbias", g.download(db, in.OC, dt)}};
      };
      const Results accumulated = run(GradWrite::kAccumulate, Vec(in.N * in.C, 0.0));
      const Results overwritten = run(GradWrite::kOverwrite, Vec(in.N * in.C, std::nan("")));
      CHECK(overwritten == accumulated);
      CHECK(accumulated.at("dweight") != g.download(w, in.C * in.OC, dt));  // it accumulated
    }
  }
}

// The weight-gradient GEMMs with cuBLASLt's bias-gradient epilogue (BGRADA for matmul's
// (C, OC) weights, BGRADB for linear's (OC, C)): dweight and dbias accumulate onto non-zero
// gradients, twice (a second micro-batch), against the CPU twins. With fp32 gradients the
// epilogue must be what ran (not declined, not failed); with bf16 gradients bias_backward runs
// (the epilogue's bf16 sum would be rounded once more than the CPU twin's).
namespace {
template <typename S, typename G>
Results cpu_weight_grads(const MatmulIn& in, bool linear) {
  const auto x = to_storage<S>(in.x), w = to_storage<S>(in.w), dout = to_storage<S>(in.dout);
  std::vector<G> dw = to_storage<G>(in.w), db = to_storage<G>(in.b);
  std::vector<float> ws(std::max(cpu::matmul_backward_workspace<S>(in.N, in.C, in.OC),
                                 cpu::linear_backward_workspace<S>(in.N, in.C, in.OC)) +
                        1);
  for (int pass = 0; pass < 2; ++pass) {
    if (linear) {
      cpu::linear_backward<S, G>(nullptr, dw.data(), db.data(), dout.data(), x.data(), w.data(),
                                 in.N, in.C, in.OC, ws.data());
    } else {
      cpu::matmul_backward<S, G>(nullptr, dw.data(), db.data(), dout.data(), x.data(), w.data(),
                                 in.N, in.C, in.OC, ws.data());
    }
  }
  return {{"dweight", to_double(dw)}, {"dbias", to_double(db)}};
}

Results gpu_weight_grads(Gpu& g, DType dt, DType gt, const MatmulIn& in, bool linear) {
  Buffer x = g.upload(in.x, dt), w = g.upload(in.w, dt), dout = g.upload(in.dout, dt);
  Buffer dw = g.upload(in.w, gt), db = g.upload(in.b, gt);
  for (int pass = 0; pass < 2; ++pass) {
    if (linear) {
      linear_backward(*g.ctx, dt, gt, Bytes(), dev(dw), dev(db), dev(dout), dev(x), dev(w), in.N,
                      in.C, in.OC);
    } else {
      matmul_backward(*g.ctx, dt, gt, Bytes(), dev(dw), dev(db), dev(dout), dev(x), dev(w), in.N,
                      in.C, in.OC);
    }
  }
  return {{"dweight", g.download(dw, in.C * in.OC, gt)}, {"dbias", g.download(db, in.OC, gt)}};
}
}  // namespace

namespace {
// The CPU twin's dbias from zeros with neither dinp nor dweight.
template <typename S, typename G>
Vec cpu_bias_grad(const MatmulIn& in, bool linear) {
  const auto x = to_storage<S>(in.x), w = to_storage<S>(in.w), dout = to_storage<S>(in.dout);
  std::vector<G> db(in.OC, G{});
  std::vector<float> ws(std::max(cpu::matmul_backward_workspace<S>(in.N, in.C, in.OC),
                                 cpu::linear_backward_workspace<S>(in.N, in.C, in.OC)) +
                        1);
  if (linear) {
    cpu::linear_backward<S, G>(nullptr, nullptr, db.data(), dout.data(), x.data(), w.data(), in.N,
                               in.C, in.OC, ws.data());
  } else {
    cpu::matmul_backward<S, G>(nullptr, nullptr, db.data(), dout.data(), x.data(), w.data(), in.N,
                               in.C, in.OC, ws.data());
  }
  return to_double(db);
}
}  // namespace

// A frozen weight's null dweight: the GEMM skipped, dinp as with a dweight (the same GEMM, so
// the same bits) and dbias from bias_backward (the epilogue had it with fp32 gradients, so against
// the CPU twin); the tied head's logits_backward likewise.
TEST_CASE("CUDA backward with a null weight gradient skips it; dinp and dbias as its CPU twin's",
          "[cuda][frozen]") {
  const MatmulIn in(64, 96, 160);
  for (bool linear : {false, true}) {
    for (const auto& [dt, gt] :
         {std::pair{DType::kFloat32, DType::kFloat32}, std::pair{DType::kBFloat16, DType::kFloat32},
          std::pair{DType::kBFloat16, DType::kBFloat16}}) {
      INFO((linear ? "linear_backward " : "matmul_backward ")
           << dtype_name(dt) << " grads " << dtype_name(gt));
      Gpu g;
      Buffer x = g.upload(in.x, dt), w = g.upload(in.w, dt), dout = g.upload(in.dout, dt);
      auto run = [&](bool with_dweight) {
        Buffer dx = g.zeros(in.N * in.C, dt), dw = g.zeros(in.C * in.OC, gt),
               db = g.zeros(in.OC, gt);
        const Bytes dweight = with_dweight ? dev(dw) : Bytes();
        if (linear) {
          linear_backward(*g.ctx, dt, gt, dev(dx), dweight, dev(db), dev(dout), dev(x), dev(w),
                          in.N, in.C, in.OC);
        } else {
          matmul_backward(*g.ctx, dt, gt, dev(dx), dweight, dev(db), dev(dout), dev(x), dev(w),
                          in.N, in.C, in.OC);
        }
        return Results{{"dinp", g.download(dx, in.N * in.C, dt)},
                       {"dweight", g.download(dw, in.C * in.OC, gt)},
                       {"dbias", g.download(db, in.OC, gt)}};
      };
      const Results full = run(true), frozen = run(false);
      CHECK(frozen.at("dinp") == full.at("dinp"));
      CHECK(frozen.at("dweight") == Vec(static_cast<std::size_t>(in.C) * in.OC, 0.0));
      CHECK(full.at("dweight") != frozen.at("dweight"));
      const Vec cpu = dt == DType::kFloat32   ? cpu_bias_grad<float, float>(in, linear)
                      : gt == DType::kFloat32 ? cpu_bias_grad<bf16, float>(in, linear)
                                              : cpu_bias_grad<bf16, bf16>(in, linear);
      // dbias is a column sum of N = 64 rows in another order than the twin's: fp32 sums differ
      // by at most N x 2^-24 (3.8e-6) relative, within 1e-5; 16-bit storage may round a sum once
      // more to bf16 (2^-8 = 3.9e-3 relative), within 1e-2 (the bounds of the epilogue test
      // below).
      compare(Results{{"dbias", frozen.at("dbias")}}, Results{{"dbias", cpu}},
              dt == DType::kFloat32 ? 1e-5 : 1e-2);
    }
  }
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    INFO("logits_backward " << dtype_name(dt));
    Gpu g;
    const Vec x = normal_values(kSeed, 51, 32 * 64), wte = normal_values(kSeed, 52, 96 * 64, 0.1);
    const Vec dl = normal_values(kSeed, 53, 32 * 96);
    Buffer bx = g.upload(x, dt), bw = g.upload(wte, dt), bl = g.upload(dl, dt);
    auto run = [&](bool with_dwte) {
      Buffer dx = g.zeros(32 * 64, dt), dw = g.zeros(96 * 64, dt);
      logits_backward(*g.ctx, dt, dt, dev(dx), with_dwte ? dev(dw) : Bytes(), dev(bl), dev(bx),
                      dev(bw), 32, 64, 96);
      return std::pair{g.download(dx, 32 * 64, dt), g.download(dw, 96 * 64, dt)};
    };
    const auto full = run(true), frozen = run(false);
    CHECK(frozen.first == full.first);
    CHECK(frozen.second == Vec(96 * 64, 0.0));
  }
}

// A frozen LayerNorm's null weight and/or bias gradient: the column sums skipped (or the one
// skipped), dinp and the other gradient the bits of the run with both, and nothing written where
// the gradient would have been. At C = 768 the 16-bit runs with sums take the one-pass kernel
// and the run with neither the dinp kernel alone: the same dinp bits still.
TEST_CASE("CUDA layernorm backward with a null weight or bias gradient skips it",
          "[cuda][frozen]") {
  for (const auto& [in, dt, gt] :
       {std::tuple{LayerNormIn{}, DType::kFloat32, DType::kFloat32},
        std::tuple{LayerNormIn{}, DType::kBFloat16, DType::kFloat32},
        std::tuple{LayerNormIn{}, DType::kBFloat16, DType::kBFloat16},
        std::tuple{LayerNormIn(100, 768), DType::kBFloat16, DType::kFloat32}}) {
    INFO("C " << in.C);
    const auto NC = static_cast<std::size_t>(in.N) * in.C, C = static_cast<std::size_t>(in.C);
    Gpu g;
    Buffer x = g.upload(in.x, dt), w = g.upload(in.w, dt), b = g.upload(in.b, dt),
           dout = g.upload(in.dout, dt);
    Buffer out = g.zeros(NC, dt), mean = g.zeros(in.N, DType::kFloat32),
           rstd = g.zeros(in.N, DType::kFloat32);
    layernorm_forward(*g.ctx, dt, dev(out), fdev(mean), fdev(rstd), dev(x), dev(w), dev(b), in.N,
                      in.C);
    auto run = [&](bool weight, bool bias) {
      Buffer dx = g.zeros(NC, dt), dw = g.zeros(C, gt), db = g.zeros(C, gt);
      layernorm_backward(*g.ctx, dt, gt, dev(dx), weight ? dev(dw) : Bytes(),
                         bias ? dev(db) : Bytes(), dev(dout), dev(x), dev(w), fdev(mean),
                         fdev(rstd), in.N, in.C);
      return Results{{"dinp", g.download(dx, NC, dt)},
                     {"dweight", g.download(dw, C, gt)},
                     {"dbias", g.download(db, C, gt)}};
    };
    const Results full = run(true, true);
    CHECK(full.at("dweight") != Vec(C, 0.0));
    CHECK(full.at("dbias") != Vec(C, 0.0));
    for (const auto& [weight, bias] :
         {std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
      INFO(dtype_name(dt) << " grads " << dtype_name(gt) << ": dweight "
                          << (weight ? "set" : "null") << ", dbias " << (bias ? "set" : "null"));
      const Results frozen = run(weight, bias);
      CHECK(frozen.at("dinp") == full.at("dinp"));
      CHECK(frozen.at("dweight") == (weight ? full.at("dweight") : Vec(C, 0.0)));
      CHECK(frozen.at("dbias") == (bias ? full.at("dbias") : Vec(C, 0.0)));
    }
  }
}

TEST_CASE("CUDA weight gradients take the bias gradient from cuBLASLt's epilogue", "[cuda]") {
  for (const MatmulIn& in : {MatmulIn(64, 96, 160), MatmulIn(256, 768, 2304)}) {
    for (bool linear : {false, true}) {
      INFO((linear ? "linear_backward" : "matmul_backward")
           << ", N " << in.N << " C " << in.C << " OC " << in.OC);
      const unsigned bit = 1u << static_cast<unsigned>(linear ? cuda::LtEpilogue::kBiasGradFromA
                                                              : cuda::LtEpilogue::kBiasGradFromB);
      {
        Gpu g;
        compare(gpu_weight_grads(g, DType::kFloat32, DType::kFloat32, in, linear),
                cpu_weight_grads<float, float>(in, linear), 1e-5);
        compare(gpu_weight_grads(g, DType::kBFloat16, DType::kFloat32, in, linear),
                cpu_weight_grads<bf16, float>(in, linear), 1e-2);
        CHECK(g.ctx->cuda()->lt_refused_epilogues == 0u);
        INFO("cuBLASLt declined the bias-gradient epilogue: bias_backward ran instead");
        CHECK((g.ctx->cuda()->lt_fused_epilogues & bit) != 0u);
      }
      Gpu g;
      compare(gpu_weight_grads(g, DType::kBFloat16, DType::kBFloat16, in, linear),
              cpu_weight_grads<bf16, bf16>(in, linear), 1e-2);
      CHECK((g.ctx->cuda()->lt_fused_epilogues & bit) == 0u);
    }
  }
}

// The MLP's GELU fused into its GEMMs (kernels/cuda/matmul_gelu.cuh) against the composition
// of the CPU twins: forward pre = x @ w1 + b1, out = gelu(pre); backward through
// matmul(act = gelu(pre), w2, b2): dpre = gelu'(pre) * (dout @ w2^T), dw2, db2. H = 128
// takes cuBLASLt's GELU epilogues where it has them (the stand-ins model them); H = 100 is
// no multiple of 8, which the epilogue's aux matrix needs, so it is the unfused path.
struct MlpIn {
  int N, C, H, OC;
  Vec x, w1, b1, w2, b2, dout;
  MlpIn(int n, int c, int h, int oc)
      : N(n),
        C(c),
        H(h),
        OC(oc),
        x(normal_values(kSeed, 41, n * c)),
        w1(normal_values(kSeed, 42, c * h, 0.1)),
        b1(normal_values(kSeed, 43, h, 0.5)),
        w2(normal_values(kSeed, 44, h * oc, 0.1)),
        b2(normal_values(kSeed, 45, oc, 0.1)),
        dout(normal_values(kSeed, 46, n * oc)) {}
};

template <typename S, typename G>
Results cpu_mlp(const MlpIn& in) {
  const auto x = to_storage<S>(in.x), w1 = to_storage<S>(in.w1), b1 = to_storage<S>(in.b1),
             w2 = to_storage<S>(in.w2), dout = to_storage<S>(in.dout);
  std::vector<S> pre(in.N * in.H), act(in.N * in.H), dact(in.N * in.H, S{}), dpre(in.N * in.H, S{});
  std::vector<G> dw2(in.H * in.OC, G{}), db2(in.OC, G{});
  std::vector<float> ws(std::max(cpu::matmul_forward_workspace<S>(in.N, in.C, in.H),
                                 cpu::matmul_backward_workspace<S>(in.N, in.H, in.OC)) +
                        1);
  cpu::matmul_forward<S>(pre.data(), x.data(), w1.data(), b1.data(), in.N, in.C, in.H, ws.data());
  cpu::gelu_forward<S>(act.data(), pre.data(), in.N * in.H);
  cpu::matmul_backward<S, G>(dact.data(), dw2.data(), db2.data(), dout.data(), act.data(),
                             w2.data(), in.N, in.H, in.OC, ws.data());
  cpu::gelu_backward<S>(dpre.data(), pre.data(), dact.data(), in.N * in.H);
  return {{"pre", to_double(pre)},
          {"act", to_double(act)},
          {"dpre", to_double(dpre)},
          {"dw2", to_double(dw2)},
          {"db2", to_double(db2)}};
}

Results gpu_mlp(Gpu& g, DType dt, DType gt, const MlpIn& in) {
  Buffer x = g.upload(in.x, dt), w1 = g.upload(in.w1, dt), b1 = g.upload(in.b1, dt),
         w2 = g.upload(in.w2, dt), dout = g.upload(in.dout, dt);
  // Outputs start as NaN: every element must be written (dpre is overwritten, not added to).
  const Vec nan(static_cast<std::size_t>(in.N) * in.H, std::nan(""));
  Buffer pre = g.upload(nan, dt), act = g.upload(nan, dt), dpre = g.upload(nan, dt),
         scratch = g.upload(nan, dt);
  Buffer dw2 = g.zeros(in.H * in.OC, gt), db2 = g.zeros(in.OC, gt);
  matmul_gelu_forward(*g.ctx, dt, dev(act), dev(pre), dev(x), dev(w1), dev(b1), in.N, in.C, in.H);
  matmul_dgelu_backward(*g.ctx, dt, gt, dev(dpre), dev(scratch), dev(dw2), dev(db2), dev(dout),
                        dev(act), dev(w2), dev(pre), in.N, in.H, in.OC);
  // cuBLASLt declining a shape is the unfused path; failing an epilogue with an error would be
  // a wrong descriptor (gemm_lt falls back and says so): the fused case must not.
  CHECK(g.ctx->cuda()->lt_refused_epilogues == 0u);
  return {{"pre", g.download(pre, in.N * in.H, dt)},
          {"act", g.download(act, in.N * in.H, dt)},
          {"dpre", g.download(dpre, in.N * in.H, dt)},
          {"dw2", g.download(dw2, in.H * in.OC, gt)},
          {"db2", g.download(db2, in.OC, gt)}};
}

TEST_CASE("CUDA matmul with GELU in cuBLASLt's epilogues matches its CPU twins", "[cuda]") {
  check_layer(MlpIn(64, 96, 128, 80), cpu_mlp<float, float>, cpu_mlp<bf16, float>,
              cpu_mlp<bf16, bf16>, gpu_mlp);
}

TEST_CASE(
    "CUDA matmul with GELU, unfused (hidden width not a multiple of 8), matches its CPU twins",
    "[cuda]") {
  check_layer(MlpIn(64, 96, 100, 80), cpu_mlp<float, float>, cpu_mlp<bf16, float>,
              cpu_mlp<bf16, bf16>, gpu_mlp);
}

// Frozen embedding tables (model.frozen): a null dwte skips the token sums, dwpe as with it
// (positions t, and packed documents' positions).
TEST_CASE("CUDA encoder_backward with a frozen token table computes the positions' alone",
          "[cuda][frozen]") {
  for (bool packed : {false, true}) {
    INFO((packed ? "packed positions" : "positions t"));
    EncoderIn in;
    if (packed) {
      for (int b = 0; b < kB; ++b) {
        for (int t = 0; t < kT; ++t) in.positions.push_back(t % 5);
      }
    }
    Gpu g;
    Buffer dout = g.upload(in.dout, DType::kFloat32), tok = g.tokens(in.tokens);
    Buffer pos = g.tokens(in.positions.empty() ? std::vector<std::int32_t>{0} : in.positions);
    const ConstTokens positions = in.positions.empty() ? ConstTokens{} : tdev(pos);
    auto run = [&](bool with_dwte) {
      Buffer dwte = g.zeros(in.wte.size(), DType::kFloat32),
             dwpe = g.zeros(in.wpe.size(), DType::kFloat32);
      encoder_backward(*g.ctx, DType::kFloat32, DType::kFloat32, with_dwte ? dev(dwte) : Bytes(),
                       dev(dwpe), dev(dout), tdev(tok), kB, kT, kC, kV, positions);
      return std::pair{g.download(dwte, in.wte.size(), DType::kFloat32),
                       g.download(dwpe, in.wpe.size(), DType::kFloat32)};
    };
    const auto full = run(true), frozen = run(false);
    CHECK(frozen.second == full.second);
    CHECK(full.first != Vec(in.wte.size(), 0.0));  // the token sums, when asked for
  }
}

// A token far more frequent than the rest (its group spans the kernel's 1024-row chunks of
// indices) and tables wider than a block (C > 1024: a thread loops over channels), packed
// positions grouped the same way: fp32 sums in row order into zeroed tables are the CPU twin's
// bits. The rows sort by key in tiles of 1024 (2100 rows: three, the last partial), 8 bits of
// key a pass: one pass for V = 50, three for V = 70 000 (a Llama-3-sized vocabulary, its
// frequent token 65 539 apart from token 3 only in the third pass's bits), two for positions.
TEST_CASE("CUDA encoder_backward sums long token groups and wide tables as its CPU twin",
          "[cuda]") {
  constexpr int B = 3, T = 700, rows = B * T;
  for (const auto& [C, V] : {std::pair{40, 50}, std::pair{1100, 50}, std::pair{40, 70000}}) {
    INFO("C " << C << ", V " << V);
    std::vector<std::int32_t> tokens = test::token_values(kSeed, 81, rows, V);
    for (int r = 0; r < rows; ++r) {
      if (r % 7 != 0) tokens[r] = 3;  // 1800 rows of token 3
      if (V > 65539 && r % 5 == 1) tokens[r] = 65539;
    }
    std::vector<std::int32_t> positions(rows);
    for (int r = 0; r < rows; ++r) positions[r] = (r % T) % 300;
    const Vec dout = normal_values(kSeed, 82, std::size_t(rows) * C);
    std::vector<float> cpu_dwte(std::size_t(V) * C, 0.0f), cpu_dwpe(std::size_t(T) * C, 0.0f);
    const std::vector<float> dout_f = to_storage<float>(dout);
    cpu::encoder_backward<float, float>(cpu_dwte.data(), cpu_dwpe.data(), dout_f.data(),
                                        tokens.data(), B, T, C, V, positions.data(), T);
    Gpu g;
    Buffer d = g.upload(dout, DType::kFloat32), tok = g.tokens(tokens), pos = g.tokens(positions);
    Buffer dwte = g.zeros(cpu_dwte.size(), DType::kFloat32),
           dwpe = g.zeros(cpu_dwpe.size(), DType::kFloat32);
    encoder_backward(*g.ctx, DType::kFloat32, DType::kFloat32, dev(dwte), dev(dwpe), dev(d),
                     tdev(tok), B, T, C, V, tdev(pos));
    CHECK(g.download(dwte, cpu_dwte.size(), DType::kFloat32) == to_double(cpu_dwte));
    CHECK(g.download(dwpe, cpu_dwpe.size(), DType::kFloat32) == to_double(cpu_dwpe));
  }
}

// GPT-2's frozen mlp.c_proj (model.frozen): a null dweight skips its GEMM; dpre (fused or not)
// is the same bits as with it, dbias the same sums in another order.
TEST_CASE("CUDA matmul_dgelu_backward with a null weight gradient skips it", "[cuda][frozen]") {
  for (int H : {128, 100}) {  // cuBLASLt's DGELU epilogue, and the unfused path
    for (const auto& [dt, gt] : {std::pair{DType::kFloat32, DType::kFloat32},
                                 std::pair{DType::kBFloat16, DType::kFloat32}}) {
      INFO("H " << H << ", " << dtype_name(dt) << " grads " << dtype_name(gt));
      const MlpIn in(64, 96, H, 80);
      Gpu g;
      Buffer act = g.upload(normal_values(kSeed, 47, in.N * in.H), dt),
             pre = g.upload(normal_values(kSeed, 48, in.N * in.H), dt), w2 = g.upload(in.w2, dt),
             dout = g.upload(in.dout, dt);
      auto run = [&](bool with_dweight) {
        Buffer dpre = g.zeros(in.N * in.H, dt), scratch = g.zeros(in.N * in.H, dt),
               dw2 = g.zeros(in.H * in.OC, gt), db2 = g.zeros(in.OC, gt);
        matmul_dgelu_backward(*g.ctx, dt, gt, dev(dpre), dev(scratch),
                              with_dweight ? dev(dw2) : Bytes(), dev(db2), dev(dout), dev(act),
                              dev(w2), dev(pre), in.N, in.H, in.OC);
        return std::tuple{g.download(dpre, in.N * in.H, dt), g.download(dw2, in.H * in.OC, gt),
                          g.download(db2, in.OC, gt)};
      };
      const auto [dpre_full, dw_full, db_full] = run(true);
      const auto [dpre_null, dw_null, db_null] = run(false);
      // The run's log line says which: DGELU fused at H = 128, declined (aux rows of 100) at 100.
      const std::string paths = cuda::describe_fused_paths(*g.ctx->cuda());
      INFO(paths);
      CHECK((paths.find("declined for some shape (the unfused kernels ran): DGELU") !=
             std::string::npos) == (H == 100));
      CHECK((paths.rfind("cuBLASLt epilogues fused: DGELU", 0) == 0) == (H == 128));
      CHECK(dpre_null == dpre_full);  // the same GEMM (fused or not) either way
      CHECK(dw_full != dw_null);
      // dbias: with dweight from cuBLASLt's bias-gradient epilogue, without it from
      // bias_backward: N = 64 rows summed in other orders, fp32 within 64 x 2^-24 = 3.8e-6
      // relative (1e-5), as the null-dweight test above bounds it.
      compare(Results{{"dbias", db_null}}, Results{{"dbias", db_full}}, 1e-5);
    }
  }
}

TEST_CASE("CUDA gelu and residual match their CPU twins", "[cuda]") {
  check_layer(ElementwiseIn{}, cpu_elementwise<float, float>, cpu_elementwise<bf16, float>,
              cpu_elementwise<bf16, bf16>, gpu_elementwise);
}

TEST_CASE("CUDA attention matches its CPU twin", "[cuda]") {
  check_layer(AttentionIn{}, cpu_attention<float, float>, cpu_attention<bf16, float>,
              cpu_attention<bf16, bf16>, gpu_attention);
}

namespace {
// The fused kernels (mma.sync, or WMMA with `wmma`) on `in` in bf16 and fp16 against the CPU twin
// in the same storage: out and dqkv within 1e-2 (bf16) and 3e-3 (fp16), lse within 1e-4 (derived
// at the first test below), and the same bits again (no atomics).
void check_fused_against_twin(const AttentionIn& in, bool wmma) {
  REQUIRE(cuda::flash_attention_supported(DType::kBFloat16, in.T, in.C, in.NH));
  KernelOptions options = test::own_attention_kernels();
  options.cuda_fused_attention = FusedAttention::kAll;  // whatever ZRT_CUDA_ATTENTION says
  options.cuda_attention_wmma = wmma;
  Gpu g(options);
  for (const auto& [dt, tol] :
       {std::pair{DType::kBFloat16, 1e-2}, std::pair{DType::kFloat16, 3e-3}}) {
    const Results want =
        dt == DType::kBFloat16 ? cpu_attention<bf16, bf16>(in) : cpu_attention<fp16, fp16>(in);
    const Results got = gpu_attention(g, dt, dt, in);
    for (const char* name : {"out", "dqkv"}) {
      const double err = test::rel_error(got.at(name), want.at(name));
      INFO(dtype_name(dt) << " " << name << ": relative error " << err << " (tolerance " << tol
                          << ")");
      CHECK(err <= tol);
    }
    const double err = test::rel_error(got.at("lse"), want.at("lse"));
    INFO(dtype_name(dt) << " lse: relative error " << err);
    CHECK(err <= 1e-4);
    CHECK(gpu_attention(g, dt, dt, in) == got);
    // kOverwrite from NaN: zeroed first, then the same kernels: the same bits.
    CHECK(gpu_attention_written(g, dt, in, GradWrite::kOverwrite) == got);
  }
}
}  // namespace

// The fused tensor-core kernels (head size 64, T a multiple of 64): four query tiles, so the
// diagonal tile, a full tile below it and the skipped tile above it all occur. Tolerances, from
// the arithmetic: the kernels round the probabilities and dS to the storage type (relative
// up to 2^-8 for bf16, 2^-11 for fp16) before their products, where the twin keeps fp32; out and
// dqkv are stored in that type by both. Per tensor that stays below a few units of 2^-8 (bf16) or
// 2^-11 (fp16): 1e-2 and 3e-3 (2.6 and 6 units). lse is fp32 on both sides; its only difference is
// the order of the fp32 sums in the 64-term scores (|error| <= 64 * 2^-24 * sum|q k| / 8, about
// 2e-5 against lse ~ log T): 1e-4.
TEST_CASE("CUDA fused attention matches its CPU twin", "[cuda]") {
  const AttentionIn in(2, 256, 128, 2);
  REQUIRE(cuda::flash_attention_supported(DType::kFloat16, in.T, in.C, in.NH));
  const bool wmma = GENERATE(false, true);  // the mma.sync kernels, then the WMMA ones
  INFO((wmma ? "WMMA kernels" : "mma.sync kernels"));
  check_fused_against_twin(in, wmma);
}

// Head size 128 (Llama-3 8B, Mistral 7B, Qwen2.5 7B): the mma.sync kernels alone (the WMMA ones
// stop at 64, and asking for them runs the mma.sync kernels), the dK/dV pass split over two
// blocks of 64 head dims. The tolerances of the case above hold as they are: the error comes
// from rounding each probability and dS to the storage type, whatever the head size; lse's
// 128-term scores change the fp32 sums' order by twice as many terms, still ~1e-5.
// The columns of (B,T,3C) dqkv in [part*C + half*hs/2, +hs/2) of every head: which kernel and
// which of dK/dV's two column blocks an error comes from (dQ: part 0; dK, dV: parts 1, 2).
Vec dqkv_piece(const Vec& dqkv, const AttentionIn& in, int part, int half) {
  const int hs = in.C / in.NH;
  Vec piece;
  for (std::size_t row = 0; row < static_cast<std::size_t>(in.B) * in.T; ++row) {
    for (int h = 0; h < in.NH; ++h) {
      const std::size_t first = row * 3 * in.C + part * in.C + h * hs + half * (hs / 2);
      piece.insert(piece.end(), dqkv.begin() + first, dqkv.begin() + first + hs / 2);
    }
  }
  return piece;
}

TEST_CASE("CUDA fused attention at head size 128 matches its CPU twin", "[cuda]") {
  const AttentionIn in(2, 256, 256, 2);
  REQUIRE(cuda::flash_attention_supported(DType::kBFloat16, in.T, in.C, in.NH));
  REQUIRE(cuda::flash_attention_supported(DType::kFloat16, in.T, in.C, in.NH));
  REQUIRE_FALSE(cuda::flash_attention_supported(DType::kBFloat16, in.T, in.C, in.NH,
                                                cuda::FlashKernels::kWmma));
  KernelOptions options = test::own_attention_kernels();
  options.cuda_fused_attention = FusedAttention::kAll;  // whatever ZRT_CUDA_ATTENTION says
  KernelOptions wmma_options = options;
  wmma_options.cuda_attention_wmma = true;
  auto check = [&](DType dt, const Results& want, double tol) {
    Results asking_wmma;
    {
      Gpu g_wmma(wmma_options);
      asking_wmma = gpu_attention(g_wmma, dt, dt, in);
    }
    Gpu g(options);
    const Results got = gpu_attention(g, dt, dt, in);
    const double out_err = test::rel_error(got.at("out"), want.at("out"));
    INFO(dtype_name(dt) << " out: relative error " << out_err << " (tolerance " << tol << ")");
    CHECK(out_err <= tol);
    for (int part = 0; part < 3; ++part) {
      for (int half = 0; half < 2; ++half) {
        const double err = test::rel_error(dqkv_piece(got.at("dqkv"), in, part, half),
                                           dqkv_piece(want.at("dqkv"), in, part, half));
        INFO(dtype_name(dt) << " d"
                            << "qkv"[part] << ", head dims " << half * 64 << "-" << half * 64 + 63
                            << ": relative error " << err << " (tolerance " << tol << ")");
        CHECK(err <= tol);
      }
    }
    const double err = test::rel_error(got.at("lse"), want.at("lse"));
    INFO(dtype_name(dt) << " lse: relative error " << err);
    CHECK(err <= 1e-4);
    CHECK(gpu_attention(g, dt, dt, in) == got);  // no atomics: deterministic
    CHECK(asking_wmma == got);                   // the same kernels
  };
  SECTION("bf16") {
    check(DType::kBFloat16, cpu_attention<bf16, bf16>(in), 1e-2);
  }
  SECTION("fp16") {
    check(DType::kFloat16, cpu_attention<fp16, fp16>(in), 3e-3);
  }
}

// cuDNN's fused attention (KernelOptions::cuda_attention_cudnn, kernels/cuda/cudnn_attention.h)
// in GPT-2's packed (B,T,3C) layout against the CPU twin: head sizes 64 and 128, and a T that is
// not a multiple of 64 (zrt's fused kernels do not take it; cuDNN does), with its deterministic
// backward and with its atomic one. The tolerances of the fused kernels above: cuDNN, as they
// do, rounds the probabilities to the storage type before multiplying by V and dS before its
// products (FlashAttention-2's scheme), and its gradients are rounded once more when added into
// dqkv (half a unit of 2^-8 at most), unless GradWrite::kIntoZeros lets cuDNN write them in
// place. The counters prove cuDNN ran, not the kernels it falls back to. A build without cuDNN
// attention (the stand-ins) must refuse the option, naming why.
TEST_CASE("CUDA attention on cuDNN matches its CPU twin", "[cuda][cudnn]") {
  KernelOptions options = test::cudnn_attention_kernels();
  if (!cuda::cudnn_attention_built()) {
    WARN("cuDNN attention not built: " << cuda::cudnn_attention_missing_reason());
    REQUIRE_THROWS_WITH(Gpu(options), Catch::Contains("cuDNN attention was asked for") &&
                                          Catch::Contains(cuda::cudnn_attention_missing_reason()));
    return;
  }
  for (const bool deterministic : {true, false}) {
    options.cuda_attention_cudnn_deterministic = deterministic;
    // The last two with a sliding window (cuDNN's diagonal band left bound): 37 and 100 tokens.
    AttentionIn windowed64(2, 256, 128, 2), windowed128(2, 200, 256, 2);
    windowed64.window = 37;
    windowed128.window = 100;
    for (const AttentionIn& in : {AttentionIn(2, 256, 128, 2), AttentionIn(2, 256, 256, 2),
                                  AttentionIn(2, 200, 256, 2), windowed64, windowed128}) {
      for (const auto& [dt, tol] :
           {std::pair{DType::kBFloat16, 1e-2}, std::pair{DType::kFloat16, 3e-3}}) {
        INFO((deterministic ? "deterministic" : "non-deterministic")
             << " backward, T " << in.T << ", hs " << in.C / in.NH << ", window " << in.window
             << ", " << dtype_name(dt));
        Gpu g(options);
        const Results got = gpu_attention(g, dt, dt, in);
        const Results want =
            dt == DType::kBFloat16 ? cpu_attention<bf16, bf16>(in) : cpu_attention<fp16, fp16>(in);
        for (const char* name : {"out", "dqkv"}) {
          const double err = test::rel_error(got.at(name), want.at(name));
          INFO(name << ": relative error " << err << " (tolerance " << tol << ")");
          CHECK(err <= tol);
        }
        const double err = test::rel_error(got.at("lse"), want.at("lse"));
        INFO("lse: relative error " << err);
        CHECK(err <= 1e-4);
        CHECK(g.ctx->cuda()->cudnn_attention_forwards == 1);
        CHECK(g.ctx->cuda()->cudnn_attention_backwards == 1);
        // Into zeroed gradients (what the models promise): cuDNN writes dqkv in place, the same
        // values as through workspace and an add onto zeros (x + 0 is x); with the
        // deterministic backward the same bits.
        const Results in_place = gpu_attention_written(g, dt, in, GradWrite::kIntoZeros);
        CHECK(g.ctx->cuda()->cudnn_attention_backwards == 2);
        // Overwritten (the models' GPT without sequence parallelism): cuDNN writes every element
        // of a dqkv that starts at NaN, in place, nothing zeroed first.
        const Results overwritten = gpu_attention_written(g, dt, in, GradWrite::kOverwrite);
        CHECK(g.ctx->cuda()->cudnn_attention_backwards == 3);
        if (deterministic) {
          CHECK(in_place == got);
          CHECK(overwritten == in_place);
          CHECK(gpu_attention(g, dt, dt, in) == got);
        } else {
          for (const Results* r : {&in_place, &overwritten}) {
            const double r_err = test::rel_error(r->at("dqkv"), want.at("dqkv"));
            INFO("dqkv written in place (" << (r == &in_place ? "into zeros" : "over NaN")
                                           << "): relative error " << r_err);
            CHECK(r_err <= tol);
          }
        }
      }
    }
  }
}

// A graph whose workspace is above KernelOptions::cuda_attention_cudnn_workspace_limit, and above
// what zrt's kernels would ask for, is declined like a shape cuDNN refuses: here the forward's 256
// bytes fit a 1 KiB limit and the deterministic backward's 528 640 bytes do not (zrt's fused
// kernels ask for 4 KiB), so cuDNN's forward runs and zrt's kernels take the backward
// from its log-sum-exp, within the twin tolerances above (the counters say who ran what). The
// planning function agrees with the run on which passes take cuDNN.
TEST_CASE("CUDA attention on cuDNN leaves a graph over its workspace limit to zrt's kernels",
          "[cuda][cudnn]") {
  if (!cuda::cudnn_attention_built()) {
    WARN("cuDNN attention not built: " << cuda::cudnn_attention_missing_reason());
    return;
  }
  const AttentionIn in(2, 256, 256, 2);
  KernelOptions options = test::cudnn_attention_kernels();
  options.cuda_attention_cudnn_workspace_limit = 1024;
  const cuda::AttentionKernels planned = cuda::attention_kernels(options);
  const auto own = [&](bool backward) {
    return backward ? cuda::attention_backward_workspace(DType::kBFloat16, in.B, in.T, in.C, in.NH,
                                                         planned)
                    : cuda::attention_forward_workspace(DType::kBFloat16, in.B, in.T, in.C, in.NH,
                                                        planned);
  };
  CHECK(cuda::cudnn_attention_planned(planned, DType::kBFloat16, false, in.B, in.T, in.NH, in.NH,
                                      in.C / in.NH, false, own(false)));
  CHECK_FALSE(cuda::cudnn_attention_planned(planned, DType::kBFloat16, false, in.B, in.T, in.NH,
                                            in.NH, in.C / in.NH, true, own(true)));
  Gpu g(options);
  const Results got = gpu_attention(g, DType::kBFloat16, DType::kBFloat16, in);
  CHECK(g.ctx->cuda()->cudnn_attention_forwards == 1);
  CHECK(g.ctx->cuda()->cudnn_attention_backwards == 0);
  const Results want = cpu_attention<bf16, bf16>(in);
  for (const char* name : {"out", "dqkv"}) {
    const double err = test::rel_error(got.at(name), want.at(name));
    INFO(name << ": relative error " << err << " (tolerance 1e-2)");
    CHECK(err <= 1e-2);
  }
}

// With packed documents cuDNN attention leaves the call to zrt's kernels (same results as
// without the option, and its counters stay at zero).
TEST_CASE("CUDA attention on cuDNN leaves packed documents to zrt's kernels",
          "[cuda][cudnn][docs]") {
  if (!cuda::cudnn_attention_built()) {  // the stand-ins: the option is refused (case above)
    WARN("cuDNN attention not built: " << cuda::cudnn_attention_missing_reason());
    KernelOptions options = test::cudnn_attention_kernels();
    REQUIRE_THROWS_AS(Gpu(options), InvalidArgument);
    return;
  }
  AttentionIn in(2, 256, 128, 2);
  in.doc_start = test::pack_documents({{1, 100, 155}, {256}}, 256).doc_start;
  KernelOptions options = test::own_attention_kernels();
  options.cuda_fused_attention = FusedAttention::kAll;
  Gpu own(options);
  options.cuda_attention_cudnn = true;
  Gpu cudnn(options);
  CHECK(gpu_attention(cudnn, DType::kBFloat16, DType::kBFloat16, in) ==
        gpu_attention(own, DType::kBFloat16, DType::kBFloat16, in));
  CHECK(cudnn.ctx->cuda()->cudnn_attention_forwards == 0);
  CHECK(cudnn.ctx->cuda()->cudnn_attention_backwards == 0);
  // Documents with a sliding window too: still zrt's kernels.
  in.window = 37;
  CHECK(gpu_attention(cudnn, DType::kBFloat16, DType::kBFloat16, in) ==
        gpu_attention(own, DType::kBFloat16, DType::kBFloat16, in));
  CHECK(cudnn.ctx->cuda()->cudnn_attention_forwards == 0);
  CHECK(cudnn.ctx->cuda()->cudnn_attention_backwards == 0);
}

// KernelOptions::cuda_fused_attention (ZRT_CUDA_ATTENTION): which shapes take the fused kernels
// (the workspace tells which path a call takes: none for the fused forward), and the batched path
// it falls back to agreeing with the CPU twin at head size 128 as the fused kernels do (the same
// tolerance: the batched path keeps fp32 scores and probabilities, so its error is below the
// fused kernels').
TEST_CASE("ZRT_CUDA_ATTENTION's settings pick the fused or the batched attention", "[cuda]") {
  const cuda::AttentionKernels all{FusedAttention::kAll, false},
      hs64{FusedAttention::kHeadSize64, false}, none{FusedAttention::kNone, false};
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    CHECK(cuda::runs_fused(all, dt, 256, 128, 2));  // head size 64
    CHECK(cuda::runs_fused(all, dt, 256, 256, 2));  // head size 128
    CHECK(cuda::runs_fused(hs64, dt, 256, 128, 2));
    CHECK_FALSE(cuda::runs_fused(hs64, dt, 256, 256, 2));
    CHECK_FALSE(cuda::runs_fused(none, dt, 256, 128, 2));
    CHECK_FALSE(cuda::runs_fused(none, dt, 256, 256, 2));
    CHECK_FALSE(cuda::runs_fused(all, dt, 200, 128, 2));  // T not a multiple of 64
    CHECK_FALSE(cuda::runs_fused(all, dt, 256, 192, 2));  // head size 96
  }
  CHECK_FALSE(cuda::runs_fused(all, DType::kFloat32, 256, 128, 2));

  const AttentionIn in(2, 256, 256, 2);
  auto workspace = [&](const cuda::AttentionKernels& k) {
    return cuda::attention_forward_workspace(DType::kBFloat16, in.B, in.T, in.C, in.NH, k);
  };
  CHECK(workspace(all) == 0);
  CHECK(workspace(none) > 0);
  CHECK(workspace(hs64) == workspace(none));
  const Results want = cpu_attention<bf16, bf16>(in);
  for (FusedAttention fused : {FusedAttention::kNone, FusedAttention::kHeadSize64}) {
    KernelOptions options = test::own_attention_kernels();
    options.cuda_fused_attention = fused;
    Gpu g(options);
    const Results got = gpu_attention(g, DType::kBFloat16, DType::kBFloat16, in);
    for (const char* name : {"out", "lse", "dqkv"}) {
      const double err = test::rel_error(got.at(name), want.at(name));
      INFO((fused == FusedAttention::kNone ? "batched" : "hs64")
           << ", head size 128, " << name << ": relative error " << err);
      CHECK(err <= 1e-2);
    }
  }
}

TEST_CASE("CUDA logits, cross-entropy and mean loss match their CPU twins", "[cuda]") {
  REQUIRE(logits_row_stride(kV) == 1024);  // padded rows, as the models run the head
  check_layer(HeadIn{}, cpu_head<float, float>, cpu_head<bf16, float>, cpu_head<bf16, bf16>,
              [](Gpu& g, DType dt, DType gt, const HeadIn& in) { return gpu_head(g, dt, gt, in); });
  SECTION("dense rows (row stride = V)") {
    Gpu g;
    compare(gpu_head(g, DType::kFloat32, DType::kFloat32, HeadIn{}, kV),
            cpu_head<float, float>(HeadIn{}), 1e-5);
  }
  // The cross-entropy kernels read a row in 16-byte packs where its stride allows and element
  // by element where not (an odd stride): both against the twin.
  SECTION("a vocabulary that ends inside a pack, padded rows (GPT-2's 50257 in 50304)") {
    Gpu g;
    const HeadIn odd(kV + 1);
    REQUIRE(logits_row_stride(odd.V) == 1024);
    compare(gpu_head(g, DType::kFloat32, DType::kFloat32, odd), cpu_head<float, float>(odd), 1e-5);
    compare(gpu_head(g, DType::kBFloat16, DType::kFloat32, odd), cpu_head<bf16, float>(odd), 1e-2);
    CHECK(gpu_head(g, DType::kBFloat16, DType::kFloat32, odd, 0, true) ==
          gpu_head(g, DType::kBFloat16, DType::kFloat32, odd, 0, false));
  }
  SECTION("an odd row stride (element loads)") {
    Gpu g;
    compare(gpu_head(g, DType::kFloat32, DType::kFloat32, HeadIn{}, kV + 3),
            cpu_head<float, float>(HeadIn{}), 1e-5);
    compare(gpu_head(g, DType::kBFloat16, DType::kFloat32, HeadIn{}, kV + 3),
            cpu_head<bf16, float>(HeadIn{}), 1e-2);
  }
  SECTION("the fused classifier gives the separate ops' bits") {
    Gpu g;
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      for (int ld : {kV, kV + 3, logits_row_stride(kV)}) {
        INFO("dtype " << dtype_name(dt) << ", row stride " << ld);
        CHECK(gpu_head(g, dt, DType::kFloat32, HeadIn{}, ld, true) ==
              gpu_head(g, dt, DType::kFloat32, HeadIn{}, ld, false));
      }
    }
  }
}

// ---- Packed documents (kernels/ops.h: doc_start, positions, targets < 0) -----------------------

namespace {
AttentionIn with_documents(AttentionIn in, const std::vector<std::vector<int>>& lengths) {
  in.doc_start = test::pack_documents(lengths, in.T).doc_start;
  return in;
}

// Sequence 0: a 1-token document, 80 tokens across the 64-token tile boundary, 1, 37 and 31;
// sequence 1: 70 and 80. T = 150 is no multiple of 64: the batched path for every dtype.
const std::vector<std::vector<int>> kDocs150 = {{1, 80, 1, 37, 31}, {70, 80}};
// T = 256, four tiles: a 1-token document; 100 from token 1, across the first tile boundary (query
// tiles 0 and 1 start their key loops in tile 0, partly masked); 1 and 26 inside tile 1; two of
// exactly one tile, 128..191 and 192..255 (their query tiles start at their own key tile, and
// the dK/dV blocks of tiles 0 and 1 stop before them); sequence 1: 200 and 56 (a document
// ending inside tile 3).
const std::vector<std::vector<int>> kDocs256 = {{1, 100, 1, 26, 64, 64}, {200, 56}};

// The rows [begin, begin + length) of sequence b of a (B,T,width) tensor, and of a (B,NH,T)
// statistic.
Vec doc_rows(const Vec& x, int T, int width, int b, int begin, int length) {
  const auto first = x.begin() + (static_cast<std::ptrdiff_t>(b) * T + begin) * width;
  return Vec(first, first + static_cast<std::ptrdiff_t>(length) * width);
}
Vec doc_stats(const Vec& x, int NH, int T, int b, int begin, int length) {
  Vec out;
  for (int h = 0; h < NH; ++h) {
    const auto first = x.begin() + (static_cast<std::ptrdiff_t>(b) * NH + h) * T + begin;
    out.insert(out.end(), first, first + length);
  }
  return out;
}
}  // namespace

// The batched path with documents: scores outside a query's document set to -inf before the
// softmax. The CPU twin computes each document on its own; per row both compute the same softmax
// over the same keys, so the unpacked op's tolerances hold (fp32 1e-5, bf16 1e-2).
TEST_CASE("CUDA attention with packed documents matches its CPU twin", "[cuda][docs]") {
  check_layer(with_documents(AttentionIn(2, 150, 128, 4), kDocs150), cpu_attention<float, float>,
              cpu_attention<bf16, float>, cpu_attention<bf16, bf16>, gpu_attention);
}

// The fused kernels with documents, head sizes 64 (mma.sync and WMMA) and 128 (mma.sync). The
// tolerances are the unpacked fused case's, for the same reason: the kernels round P and dS to
// the storage type before their products (a row's window being its document changes neither
// that rounding nor lse's fp32 sums, which get shorter).
TEST_CASE("CUDA fused attention with packed documents matches its CPU twin", "[cuda][docs]") {
  for (const auto& [C, wmma] :
       {std::pair{128, false}, std::pair{128, true}, std::pair{256, false}}) {
    INFO("head size " << C / 2 << (wmma ? ", WMMA kernels" : ", mma.sync kernels"));
    check_fused_against_twin(with_documents(AttentionIn(2, 256, C, 2), kDocs256), wmma);
  }
}

// Sliding windows (kernels/ops.h: query t sees keys after t - window), alone and with packed
// documents, on the batched path (T 150: the scores before the window masked to -inf) and the
// fused kernels (T 256, head sizes 64 on mma.sync and WMMA and 128 on mma.sync: key tiles before
// the window skipped, partly covered ones masked); windows of 1, 37 and 100 tokens put the edge
// at several positions of a tile. Each row's softmax runs over fewer keys than the unwindowed
// row's, so the unwindowed cases' tolerances hold as they do for documents.
TEST_CASE("CUDA attention with a sliding window matches its CPU twin", "[cuda][window]") {
  for (const int window : {1, 37, 100}) {
    INFO("window " << window);
    AttentionIn batched(2, 150, 128, 4);
    batched.window = window;
    check_layer(batched, cpu_attention<float, float>, cpu_attention<bf16, float>,
                cpu_attention<bf16, bf16>, gpu_attention);
    AttentionIn packed = with_documents(AttentionIn(2, 150, 128, 4), kDocs150);
    packed.window = window;
    check_layer(packed, cpu_attention<float, float>, cpu_attention<bf16, float>,
                cpu_attention<bf16, bf16>, gpu_attention);
  }
  for (const auto& [C, wmma] :
       {std::pair{128, false}, std::pair{128, true}, std::pair{256, false}}) {
    for (const bool documents : {false, true}) {
      AttentionIn in = documents ? with_documents(AttentionIn(2, 256, C, 2), kDocs256)
                                 : AttentionIn(2, 256, C, 2);
      in.window = documents ? 100 : 37;
      INFO("head size " << C / 2 << (wmma ? ", WMMA kernels" : ", mma.sync kernels")
                        << (documents ? ", documents" : "") << ", window " << in.window);
      check_fused_against_twin(in, wmma);
    }
  }
}

// On every path (batched in fp32 and bf16, fused bf16 and fp16 on both kernel sets): a change to
// one token (its q, k, v and dout) leaves every other document's out, lse and dqkv as they were,
// bit for bit: no score of theirs includes it (skipped tiles are not read, masked scores are -inf,
// their probabilities exact zeros). And doc_start all zero (one document per sequence) gives the
// bits of no doc_start: the same arithmetic.
TEST_CASE("CUDA attention never reads across a document boundary", "[cuda][docs]") {
  struct Case {
    int T, C;
    DType dt;
    bool wmma;
  };
  for (const Case c :
       {Case{150, 128, DType::kFloat32, false}, Case{150, 128, DType::kBFloat16, false},
        Case{256, 128, DType::kBFloat16, false}, Case{256, 128, DType::kBFloat16, true},
        Case{256, 256, DType::kFloat16, false}}) {
    const auto& docs = c.T == 150 ? kDocs150 : kDocs256;
    const AttentionIn in = with_documents(AttentionIn(2, c.T, c.C, 2), docs);
    INFO("T " << c.T << ", head size " << c.C / 2 << ", " << dtype_name(c.dt)
              << (c.wmma ? ", WMMA kernels" : ""));
    KernelOptions options = test::own_attention_kernels();
    options.cuda_fused_attention = FusedAttention::kAll;
    options.cuda_attention_wmma = c.wmma;
    Gpu g(options);
    const Results base = gpu_attention(g, c.dt, c.dt, in);
    const int t = 40;  // inside document [1, 81) or [1, 101) of sequence 0
    AttentionIn changed = in;
    for (int j = 0; j < 3 * c.C; ++j) changed.qkv[static_cast<std::size_t>(t) * 3 * c.C + j] += 3.0;
    for (int j = 0; j < c.C; ++j) changed.dout[static_cast<std::size_t>(t) * c.C + j] -= 2.0;
    const Results after = gpu_attention(g, c.dt, c.dt, changed);
    for (const auto& doc : test::pack_documents(docs, c.T).spans) {
      INFO("document of sequence " << doc.b << " at " << doc.begin);
      const bool own = doc.b == 0 && doc.begin <= t && t < doc.begin + doc.length;
      auto rows = [&](const Results& r, const char* name, int width) {
        return doc_rows(r.at(name), c.T, width, doc.b, doc.begin, doc.length);
      };
      if (own) {
        CHECK(rows(after, "dqkv", 3 * c.C) != rows(base, "dqkv", 3 * c.C));
        continue;
      }
      CHECK(rows(after, "out", c.C) == rows(base, "out", c.C));
      CHECK(rows(after, "dqkv", 3 * c.C) == rows(base, "dqkv", 3 * c.C));
      CHECK(doc_stats(after.at("lse"), 2, c.T, doc.b, doc.begin, doc.length) ==
            doc_stats(base.at("lse"), 2, c.T, doc.b, doc.begin, doc.length));
    }
    AttentionIn one = in, none = in;
    one.doc_start.assign(in.doc_start.size(), 0);
    none.doc_start.clear();
    CHECK(gpu_attention(g, c.dt, c.dt, one) == gpu_attention(g, c.dt, c.dt, none));
  }
}

// The pipelined mma kernels (KernelOptions::cuda_attention_pipelined: the next tile's copy in
// flight while one is computed, operands read with ldmatrix at the lane maps test_mma_fragments
// checks) against the staged ones the cases above check against the CPU twin: the same products
// in the same order, so the same bits of out, lse and dqkv. Head sizes 64 and 128, bf16 and fp16,
// without and with packed documents, over 8 key tiles (each of the two buffers refilled four
// times; documents that skip tiles, so that a copy in flight is one the block then passes over)
// and two sequences of two heads; and the CPU twin's tolerances, for the record of the failure.
TEST_CASE("CUDA fused attention pipelined gives the staged kernels' bits", "[cuda][docs]") {
  const std::vector<std::vector<int>> docs512 = {{1, 100, 1, 26, 64, 64, 256}, {200, 56, 256}};
  for (const int C : {128, 256}) {
    for (const bool documents : {false, true}) {
      AttentionIn in(2, 512, C, 2);
      if (documents) in = with_documents(in, docs512);
      REQUIRE(cuda::flash_attention_supported(DType::kBFloat16, in.T, in.C, in.NH,
                                              cuda::FlashKernels::kMmaPipelined));
      KernelOptions staged_options = test::own_attention_kernels();
      staged_options.cuda_fused_attention =
          FusedAttention::kAll;  // whatever ZRT_CUDA_ATTENTION says
      staged_options.cuda_attention_pipelined = false;
      KernelOptions pipelined_options = staged_options;
      pipelined_options.cuda_attention_pipelined = true;
      Gpu staged(staged_options), pipelined(pipelined_options);
      for (const auto& [dt, tol] :
           {std::pair{DType::kBFloat16, 1e-2}, std::pair{DType::kFloat16, 3e-3}}) {
        INFO("head size " << C / 2 << (documents ? ", packed documents, " : ", ")
                          << dtype_name(dt));
        const Results want = gpu_attention(staged, dt, dt, in);
        const Results got = gpu_attention(pipelined, dt, dt, in);
        for (const char* name : {"out", "lse", "dqkv"}) {
          INFO(name);
          CHECK(got.at(name) == want.at(name));
        }
        const Results twin =
            dt == DType::kBFloat16 ? cpu_attention<bf16, bf16>(in) : cpu_attention<fp16, fp16>(in);
        for (const char* name : {"out", "dqkv"}) {
          const double err = test::rel_error(got.at(name), twin.at(name));
          INFO(name << ": relative error against the CPU twin " << err << " (tolerance " << tol
                    << ")");
          CHECK(err <= tol);
        }
      }
    }
  }
}

// GPT-2's learned positions restart in each document: wpe row positions[b*T+t], and dwpe sums
// each position's rows (the CUDA twin links them as it links the token rows). The unpacked
// tolerances hold (the same sums per row); positions 0..T-1 give the bits of none.
TEST_CASE("CUDA encoder with positions matches its CPU twin", "[cuda][docs]") {
  EncoderIn in;
  in.positions = test::pack_documents({{1, 30, 33}, {20, 44}}, kT).positions;
  check_layer(in, cpu_encoder<float, float>, cpu_encoder<bf16, float>, cpu_encoder<bf16, bf16>,
              gpu_encoder);
  SECTION("positions 0..T-1 are the unpacked encoder") {
    EncoderIn identity;
    for (int i = 0; i < kN; ++i) identity.positions.push_back(i % kT);
    Gpu g;
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      CHECK(gpu_encoder(g, dt, DType::kFloat32, identity) ==
            gpu_encoder(g, dt, DType::kFloat32, EncoderIn{}));
    }
  }
}

// Targets < 0 are out of the loss: the head's parity with some rows masked and the mean over a
// divisor (the unpacked tolerances), then on the GPU itself: a masked row's loss 0 and gradient
// row 0, every other row the bits of the unmasked call (each row is its own block), fused and not.
TEST_CASE("CUDA cross-entropy leaves out targets < 0; loss_mean takes a divisor", "[cuda][docs]") {
  HeadIn in;
  const std::vector<int> masked = {0, 7, 8, 63, kN - 1};
  for (int n : masked) in.targets[n] = -1;
  in.divisor = static_cast<float>(kN - static_cast<int>(masked.size()));
  check_layer(in, cpu_head<float, float>, cpu_head<bf16, float>, cpu_head<bf16, bf16>,
              [](Gpu& g, DType dt, DType gt, const HeadIn& h) { return gpu_head(g, dt, gt, h); });
  SECTION("masked rows: loss 0 and a zero gradient; the others the unmasked bits") {
    Gpu g;
    const int ld = logits_row_stride(kV);
    for (bool fused : {true, false}) {
      INFO((fused ? "crossentropy_forward_backward" : "crossentropy_forward + _backward"));
      const Results m = gpu_head(g, DType::kBFloat16, DType::kFloat32, in, ld, fused);
      const Results f = gpu_head(g, DType::kBFloat16, DType::kFloat32, HeadIn{}, ld, fused);
      for (int n = 0; n < kN; ++n) {
        const bool out = in.targets[n] < 0;
        INFO("row " << n);
        CHECK(m.at("losses")[n] == (out ? 0.0 : f.at("losses")[n]));
        const Vec row = doc_rows(m.at("dlogits"), 1, kV, 0, n, 1);
        CHECK(row == (out ? Vec(kV, 0.0) : doc_rows(f.at("dlogits"), 1, kV, 0, n, 1)));
      }
      double sum = 0;
      for (double l : m.at("losses")) sum += l;
      CHECK(m.at("mean")[0] == Approx(sum / in.divisor).epsilon(1e-6));
    }
  }
}

TEST_CASE("CUDA backward passes are deterministic", "[cuda]") {
  Gpu g;
  const EncoderIn enc;
  const LayerNormIn ln;
  const MatmulIn mm(kN, kC, 4 * kC);
  CHECK(gpu_encoder(g, DType::kFloat32, DType::kFloat32, enc) ==
        gpu_encoder(g, DType::kFloat32, DType::kFloat32, enc));
  CHECK(gpu_layernorm(g, DType::kFloat32, DType::kFloat32, ln) ==
        gpu_layernorm(g, DType::kFloat32, DType::kFloat32, ln));
  CHECK(gpu_matmul(g, DType::kBFloat16, DType::kFloat32, mm) ==
        gpu_matmul(g, DType::kBFloat16, DType::kFloat32, mm));
}

TEST_CASE("tiny GPT on the GPU matches PyTorch (fp32)", "[cuda][gpt]") {
  const auto& golden = test::golden()["gpt"];
  gpt::GptConfig config;
  config.n_layer = golden["config"]["n_layer"];
  config.n_head = golden["config"]["n_head"];
  config.n_embd = golden["config"]["n_embd"];
  config.vocab_size = golden["config"]["vocab_size"];
  config.seq_len = golden["config"]["seq_len"];
  for (bool checkpointing : {false, true}) {
    Gpu g;
    gpt::Gpt model(config, *g.ctx, gpt::GptOptions{checkpointing});
    FlatParamAccess access(*g.device, *g.stream, model.parameters(), model.num_modules(),
                           DType::kFloat32, DType::kFloat32);
    access.init_from(model, golden["seed"]);
    const auto tokens = golden["tokens"].get<std::vector<std::int32_t>>();
    const auto targets = golden["targets"].get<std::vector<std::int32_t>>();
    Buffer tok = g.tokens(tokens), tgt = g.tokens(targets);
    const TokenBatch batch{tok.device<const std::int32_t>(), tgt.device<const std::int32_t>(),
                           golden["B"], golden["T"]};
    model.forward_backward(access, batch, 1.0f);
    const double loss = model.read_loss();
    const double want = golden["loss"];
    CHECK(std::abs(loss - want) / want <= 1e-5);
    for (int i = 0; i < static_cast<int>(model.parameters().size()); ++i) {
      const auto& name = model.parameters()[i].name;
      const double err =
          test::rel_error(access.read_grad(i), test::golden_tensor(golden["grads"][name]));
      INFO(name << " (checkpointing " << checkpointing << "): relative error " << err);
      CHECK(err <= 1e-5);
    }
  }
}

}  // namespace
}  // namespace zrt::kernels
