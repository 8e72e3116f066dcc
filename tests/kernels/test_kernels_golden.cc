// Every CPU twin against PyTorch (tests/golden/gpt_golden.json, float64 on the same float32
// inputs): fp32 within 1e-5 per-tensor relative error; bf16 / fp16 storage (fp32 compute)
// within 16-bit tolerances, with fp32 and 16-bit gradient buffers; results independent of the
// OpenMP thread count (bit for bit); and the ops.h entry points on the CPU backend (stream-
// ordered, asynchronous) equal to direct calls.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "kernels/ops.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::kernels::cpu {
namespace {

using test::kLayerSeed;
using test::normal_values;
using test::to_double;
using test::to_storage;
using Vec = std::vector<double>;
using Results = std::map<std::string, Vec>;

const nlohmann::json& dims(const char* layer) {
  return test::golden()["layers"][layer]["dims"];
}

template <typename S, typename G>
Results run_encoder() {
  const auto& d = dims("encoder");
  const int B = d["B"], T = d["T"], C = d["C"], V = d["V"];
  const auto wte = to_storage<S>(normal_values(kLayerSeed, 1, V * C));
  const auto wpe = to_storage<S>(normal_values(kLayerSeed, 2, T * C));
  const auto dout = to_storage<S>(normal_values(kLayerSeed, 3, B * T * C));
  const auto tokens = test::token_values(kLayerSeed, 4, B * T, V);
  std::vector<S> out(B * T * C);
  std::vector<G> dwte(wte.size(), G{}), dwpe(wpe.size(), G{});
  encoder_forward<S>(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
  encoder_backward<S, G>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, V);
  return {{"out", to_double(out)}, {"dwte", to_double(dwte)}, {"dwpe", to_double(dwpe)}};
}

template <typename S, typename G>
Results run_layernorm() {
  const auto& d = dims("layernorm");
  const int N = d["N"], C = d["C"];
  const auto x = to_storage<S>(normal_values(kLayerSeed, 11, N * C, 2.0, 0.5));
  const auto w = to_storage<S>(normal_values(kLayerSeed, 12, C, 0.1, 1.0));
  const auto b = to_storage<S>(normal_values(kLayerSeed, 13, C, 0.1));
  const auto dout = to_storage<S>(normal_values(kLayerSeed, 14, N * C));
  std::vector<S> out(N * C), dx(N * C, S{});
  std::vector<acc_t<S>> mean(N), rstd(N);
  std::vector<G> dw(C, G{}), db(C, G{});
  layernorm_forward<S>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward<S, G>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
  return {{"out", to_double(out)}, {"mean", to_double(mean)},  {"rstd", to_double(rstd)},
          {"dinp", to_double(dx)}, {"dweight", to_double(dw)}, {"dbias", to_double(db)}};
}

template <typename S, typename G>
Results run_matmul() {
  const auto& d = dims("matmul");
  const int N = d["N"], C = d["C"], OC = d["OC"];
  const auto x = to_storage<S>(normal_values(kLayerSeed, 21, N * C));
  const auto w = to_storage<S>(normal_values(kLayerSeed, 22, C * OC, 0.1));
  const auto b = to_storage<S>(normal_values(kLayerSeed, 23, OC, 0.1));
  const auto dout = to_storage<S>(normal_values(kLayerSeed, 24, N * OC));
  std::vector<S> out(N * OC), dx(N * C, S{});
  std::vector<G> dw(C * OC, G{}), db(OC, G{});
  std::vector<acc_t<S>> ws(
      std::max(matmul_forward_workspace<S>(N, C, OC), matmul_backward_workspace<S>(N, C, OC)) + 1);
  matmul_forward<S>(out.data(), x.data(), w.data(), b.data(), N, C, OC, ws.data());
  matmul_backward<S, G>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC,
                        ws.data());
  return {{"out", to_double(out)},
          {"dinp", to_double(dx)},
          {"dweight", to_double(dw)},
          {"dbias", to_double(db)}};
}

template <typename S, typename G>
Results run_gelu() {
  const int n = dims("gelu")["n"];
  const auto x = to_storage<S>(normal_values(kLayerSeed, 31, n, 2.0));
  const auto dout = to_storage<S>(normal_values(kLayerSeed, 32, n));
  std::vector<S> out(n), dx(n, S{});
  gelu_forward<S>(out.data(), x.data(), n);
  gelu_backward<S>(dx.data(), x.data(), dout.data(), n);
  return {{"out", to_double(out)}, {"dinp", to_double(dx)}};
}

template <typename S, typename G>
Results run_residual() {
  const int n = dims("residual")["n"];
  const auto a = to_storage<S>(normal_values(kLayerSeed, 41, n));
  const auto b = to_storage<S>(normal_values(kLayerSeed, 42, n));
  const auto dout = to_storage<S>(normal_values(kLayerSeed, 43, n));
  std::vector<S> out(n), da(n, S{}), db(n, S{});
  residual_forward<S>(out.data(), a.data(), b.data(), n);
  residual_backward<S>(da.data(), db.data(), dout.data(), n);
  return {{"out", to_double(out)}, {"da", to_double(da)}, {"db", to_double(db)}};
}

template <typename S, typename G>
Results run_attention() {
  const auto& d = dims("attention");
  const int B = d["B"], T = d["T"], C = d["C"], NH = d["NH"];
  const auto qkv = to_storage<S>(normal_values(kLayerSeed, 51, B * T * 3 * C));
  const auto dout = to_storage<S>(normal_values(kLayerSeed, 52, B * T * C));
  std::vector<S> out(B * T * C), dqkv(qkv.size(), S{});
  std::vector<acc_t<S>> lse(static_cast<std::size_t>(B) * NH * T);
  std::vector<acc_t<S>> ws(std::max(attention_forward_workspace<S>(B, T, C, NH),
                                    attention_backward_workspace<S>(B, T, C, NH)) +
                           1);
  attention_forward<S>(out.data(), lse.data(), qkv.data(), B, T, C, NH, ws.data());
  attention_backward<S>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH,
                        ws.data());
  // The golden file holds PyTorch's probabilities; the twin keeps only each row's log-sum-exp,
  // so compare the probabilities it implies: exp(q.k / sqrt(hs) - lse) on the causal prefix.
  const int hs = C / NH;
  const Vec x = to_double(qkv);
  Vec att(static_cast<std::size_t>(B) * NH * T * T, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        for (int u = 0; u <= t; ++u) {
          double s = 0;
          for (int e = 0; e < hs; ++e) {
            s += x[(static_cast<std::size_t>(b) * T + t) * 3 * C + h * hs + e] *
                 x[(static_cast<std::size_t>(b) * T + u) * 3 * C + C + h * hs + e];
          }
          const std::size_t row = (static_cast<std::size_t>(b) * NH + h) * T + t;
          att[row * T + u] = std::exp(s / std::sqrt(static_cast<double>(hs)) - lse[row]);
        }
      }
    }
  }
  return {{"out", to_double(out)}, {"att", att}, {"dqkv", to_double(dqkv)}};
}

// The head runs as the models run it: logits in rows padded to logits_row_stride(V). The padding
// columns of every input hold NaN, so a kernel that read one would fail the comparison.
template <typename T>
std::vector<T> padded_rows(const std::vector<T>& dense, int rows, int V, int ld) {
  std::vector<T> out(static_cast<std::size_t>(rows) * ld, to_storage<T>(Vec{std::nan("")})[0]);
  for (int n = 0; n < rows; ++n) {
    std::copy(dense.begin() + static_cast<std::ptrdiff_t>(n) * V,
              dense.begin() + static_cast<std::ptrdiff_t>(n + 1) * V,
              out.begin() + static_cast<std::ptrdiff_t>(n) * ld);
  }
  return out;
}

Vec dense_rows(const Vec& padded, int rows, int V, int ld) {
  Vec out;
  for (int n = 0; n < rows; ++n) {
    out.insert(out.end(), padded.begin() + static_cast<std::ptrdiff_t>(n) * ld,
               padded.begin() + static_cast<std::ptrdiff_t>(n) * ld + V);
  }
  return out;
}

template <typename S, typename G>
Results run_logits() {
  const auto& d = dims("logits");
  const int N = d["N"], C = d["C"], V = d["V"];
  const int ld = logits_row_stride(V);
  REQUIRE(ld > V);
  const auto x = to_storage<S>(normal_values(kLayerSeed, 61, N * C));
  const auto wte = to_storage<S>(normal_values(kLayerSeed, 62, V * C, 0.1));
  const auto dout = padded_rows(to_storage<S>(normal_values(kLayerSeed, 63, N * V)), N, V, ld);
  std::vector<S> logits(static_cast<std::size_t>(N) * ld), dx(N * C, S{});
  std::vector<G> dwte(V * C, G{});
  std::vector<acc_t<S>> ws(std::max(logits_forward_workspace<S>(N, C, V, ld),
                                    logits_backward_workspace<S>(N, C, V, ld)) +
                           1);
  logits_forward<S>(logits.data(), x.data(), wte.data(), N, C, V, ws.data(), ld);
  logits_backward<S, G>(dx.data(), dwte.data(), dout.data(), x.data(), wte.data(), N, C, V,
                        ws.data(), ld);
  return {{"logits", dense_rows(to_double(logits), N, V, ld)},
          {"dinp", to_double(dx)},
          {"dwte", to_double(dwte)}};
}

template <typename S, typename G>
Results run_crossentropy() {
  const auto& d = dims("crossentropy");
  const int N = d["N"], V = d["V"];
  const int ld = logits_row_stride(V);
  const auto logits =
      padded_rows(to_storage<S>(normal_values(kLayerSeed, 71, N * V, 2.0)), N, V, ld);
  const auto targets = test::token_values(kLayerSeed, 72, N, V);
  std::vector<acc_t<S>> losses(N);
  std::vector<S> dlogits = logits;  // in place, as the model does
  crossentropy_forward<S>(losses.data(), logits.data(), targets.data(), N, V, ld);
  crossentropy_backward<S>(dlogits.data(), dlogits.data(), targets.data(), acc_t<S>(1) / N, N, V,
                           ld);
  for (int n = 0; n < N; ++n) {  // the padding comes back zero (the CUDA head sums over it)
    for (int v = V; v < ld; ++v) REQUIRE(load<double>(dlogits[std::size_t(n) * ld + v]) == 0.0);
  }
  return {{"losses", to_double(losses)}, {"dlogits", dense_rows(to_double(dlogits), N, V, ld)}};
}

template <typename S, typename G>
Results run_layer(const std::string& layer) {
  if (layer == "encoder") return run_encoder<S, G>();
  if (layer == "layernorm") return run_layernorm<S, G>();
  if (layer == "matmul") return run_matmul<S, G>();
  if (layer == "gelu") return run_gelu<S, G>();
  if (layer == "residual") return run_residual<S, G>();
  if (layer == "attention") return run_attention<S, G>();
  if (layer == "logits") return run_logits<S, G>();
  if (layer == "crossentropy") return run_crossentropy<S, G>();
  FAIL("unknown layer " << layer);
  return {};
}

const char* const kLayers[] = {"encoder",  "layernorm", "matmul", "gelu",
                               "residual", "attention", "logits", "crossentropy"};

// Every golden tensor of `layer` against `got`, per-tensor relative error <= tol.
void compare_with_golden(const std::string& layer, const Results& got, double tol) {
  const auto& tensors = test::golden()["layers"][layer]["tensors"];
  for (const auto& [name, data] : tensors.items()) {
    const Vec want = test::golden_tensor(data);
    REQUIRE(got.count(name) == 1);
    const double err = test::rel_error(got.at(name), want);
    INFO(layer << "." << name << ": relative error " << err << " (tolerance " << tol << ")");
    CHECK(err <= tol);
  }
}

TEST_CASE("fp32 CPU kernels match PyTorch per layer", "[golden]") {
  omp_set_num_threads(1);
  for (const char* layer : kLayers) {
    SECTION(layer) {
      compare_with_golden(layer, run_layer<float, float>(layer), 1e-5);
    }
  }
}

TEST_CASE("bf16 and fp16 storage match PyTorch within 16-bit tolerances", "[golden]") {
  omp_set_num_threads(2);
  for (const char* layer : kLayers) {
    SECTION(layer) {
      // bf16 keeps 8 significant bits (relative rounding up to 2^-8 = 3.9e-3 per value), fp16 11
      // (2^-11 = 4.9e-4): the bounds are a few such roundings, 2.6 and 3 of them.
      compare_with_golden(layer, run_layer<bf16, float>(layer), 1e-2);
      compare_with_golden(layer, run_layer<bf16, bf16>(layer), 1e-2);
      compare_with_golden(layer, run_layer<fp16, float>(layer), 1.5e-3);
      compare_with_golden(layer, run_layer<fp16, fp16>(layer), 1.5e-3);
    }
  }
}

TEST_CASE("CPU kernels give the same bits with 1 and 2 OpenMP threads", "[threads]") {
  for (const char* layer : kLayers) {
    SECTION(layer) {
      omp_set_num_threads(1);
      const Results one = run_layer<float, float>(layer);
      const Results one16 = run_layer<bf16, float>(layer);
      omp_set_num_threads(2);
      const Results two = run_layer<float, float>(layer);
      const Results two16 = run_layer<bf16, float>(layer);
      CHECK(one == two);
      CHECK(one16 == two16);
    }
  }
}

// GPT-2-sized GEMM tiles (several tiles per dimension): the tiled parallel GEMM is exact
// across thread counts there too.
TEST_CASE("matmul on multi-tile shapes is thread-count independent", "[threads]") {
  const int N = 300, C = 192, OC = 1100;
  const auto x = test::cast_vector<float>(normal_values(5, 1, N * C));
  const auto w = test::cast_vector<float>(normal_values(5, 2, C * OC, 0.05));
  const auto b = test::cast_vector<float>(normal_values(5, 3, OC, 0.05));
  const auto dy = test::cast_vector<float>(normal_values(5, 4, N * OC));
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> out(N * OC), dx(N * C, 0.f), dw(C * OC, 0.f), db(OC, 0.f);
    matmul_forward<float>(out.data(), x.data(), w.data(), b.data(), N, C, OC, nullptr);
    matmul_backward<float, float>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N,
                                  C, OC, nullptr);
    return std::vector<std::vector<float>>{out, dx, dw, db};
  };
  const auto one = run(1);
  CHECK(one == run(2));
  CHECK(one == run(3));
}

TEST_CASE("ops.h on the CPU backend enqueues the twins on the stream", "[ops]") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("compute");
  KernelContext ctx(*device, *stream, KernelOptions{2});
  const auto& d = dims("matmul");
  const int N = d["N"], C = d["C"], OC = d["OC"];
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const std::size_t es = dtype_size(dt);
    auto upload = [&](const Vec& v) {
      Buffer buf =
          device->allocate(static_cast<std::int64_t>(v.size() * es), MemCategory::kOther, "test");
      std::vector<std::byte> bytes(v.size() * es);
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (dt == DType::kFloat32) {
          const float f = static_cast<float>(v[i]);
          std::memcpy(&bytes[i * 4], &f, 4);
        } else {
          const bf16 h = to_bf16(static_cast<float>(v[i]));
          std::memcpy(&bytes[i * 2], &h, 2);
        }
      }
      device->copy_to_device(buf.device<std::byte>(), bytes.data(), bytes.size(), *stream);
      stream->synchronize();
      return buf;
    };
    auto download = [&](const Buffer& buf) {
      std::vector<std::byte> bytes(static_cast<std::size_t>(buf.bytes()));
      device->copy_to_host(bytes.data(), buf.device<std::byte>(), bytes.size(), *stream);
      stream->synchronize();
      Vec v(bytes.size() / es);
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (dt == DType::kFloat32) {
          float f;
          std::memcpy(&f, &bytes[i * 4], 4);
          v[i] = f;
        } else {
          bf16 h;
          std::memcpy(&h, &bytes[i * 2], 2);
          v[i] = to_float(h);
        }
      }
      return v;
    };
    Buffer x = upload(normal_values(kLayerSeed, 21, N * C));
    Buffer w = upload(normal_values(kLayerSeed, 22, C * OC, 0.1));
    Buffer b = upload(normal_values(kLayerSeed, 23, OC, 0.1));
    Buffer dy = upload(normal_values(kLayerSeed, 24, N * OC));
    Buffer out = upload(Vec(N * OC, 0.0));
    Buffer dx = upload(Vec(N * C, 0.0));
    Buffer dw = upload(Vec(C * OC, 0.0));
    Buffer db = upload(Vec(OC, 0.0));
    matmul_forward(ctx, dt, out.device<std::byte>(), x.device<std::byte>(), w.device<std::byte>(),
                   b.device<std::byte>(), N, C, OC);
    matmul_backward(ctx, dt, dt, dx.device<std::byte>(), dw.device<std::byte>(),
                    db.device<std::byte>(), dy.device<std::byte>(), x.device<std::byte>(),
                    w.device<std::byte>(), N, C, OC);
    const Results direct =
        dt == DType::kFloat32 ? run_matmul<float, float>() : run_matmul<bf16, bf16>();
    CHECK(download(out) == direct.at("out"));
    CHECK(download(dx) == direct.at("dinp"));
    CHECK(download(dw) == direct.at("dweight"));
    CHECK(download(db) == direct.at("dbias"));
  }
  CHECK_THROWS_AS(check_dtypes(DType::kFloat32, DType::kBFloat16), InvalidArgument);
  CHECK_THROWS_AS(check_dtypes(DType::kBFloat16, DType::kFloat16), InvalidArgument);
}

}  // namespace
}  // namespace zrt::kernels::cpu
