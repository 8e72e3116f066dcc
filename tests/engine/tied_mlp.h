// A small model for engine tests: L + 2 modules, the first and last sharing one weight (as GPT
// ties its token embedding), plus biases small enough to be persistent at stage 3.
//
//   m0:      h_0 = tanh(x W)                 W: (D, H) "embed.weight", shared with m(L+1)
//   m1..mL:  h_l = tanh(h_{l-1} W_l + b_l)   W_l: (H, H) "fc{l}.weight", b_l: (H)
//   m(L+1):  y   = h_L W^T + bo              bo: (D) "out.bias"
//   loss = mean over B x D of (y - t)^2
//
// Runs on the CPU backend: each module's math is enqueued on the compute stream between the
// engine's acquire() and release(), reading parameters and accumulating gradients through
// ParamAccess in its dtypes (fp32 or bf16/fp16 storage, fp32 arithmetic).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/device/cpu_stream.h"
#include "runtime/device/device.h"
#include "runtime/device/device_access.h"
#include "runtime/model_interface.h"

namespace zrt::test {

class TiedMlp {
 public:
  TiedMlp(int d, int h, int layers = 2) : d_(d), h_(h), layers_(layers) {}
  int modules() const { return layers_ + 2; }
  int d() const { return d_; }

  std::vector<ParamSpec> parameters() const {
    const std::int64_t d = d_, h = h_;
    std::vector<ParamSpec> out{{"embed.weight", {d, h}, {0, layers_ + 1}, false}};
    for (int l = 1; l <= layers_; ++l) {
      out.push_back({"fc" + std::to_string(l) + ".weight", {h, h}, {l}, false});
      out.push_back({"fc" + std::to_string(l) + ".bias", {h}, {l}, true});
    }
    out.push_back({"out.bias", {d}, {layers_ + 1}, true});
    return out;
  }

  // Deterministic initial values, independent of how they are sliced.
  static float init_value(int param, std::int64_t i) {
    std::uint64_t x = (static_cast<std::uint64_t>(param) << 32) ^ static_cast<std::uint64_t>(i);
    x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
    x = (x ^ (x >> 27)) * 0x81dadef4bc2dd44dull;
    x ^= x >> 33;
    return (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.6f;
  }

  // Enqueues forward and backward for one micro-batch of `b` rows; x and t (b x D, host) must
  // stay valid until the stream is synchronised. *loss receives the (unscaled) loss.
  void forward_backward(ParamAccess& pa, Stream& stream, const float* x, const float* t, int b,
                        double loss_scale, float* loss) {
    run(pa, stream, x, t, b, loss_scale, loss, /*backward=*/true);
  }
  // Forward only (Phase::kEval): the loss, no gradients.
  void forward_only(ParamAccess& pa, Stream& stream, const float* x, const float* t, int b,
                    float* loss) {
    run(pa, stream, x, t, b, 1.0, loss, /*backward=*/false);
  }
  // Activation checkpointing: recompute each hidden layer's forward inside its backward.
  void set_recompute(bool on) { recompute_ = on; }

 private:
  void run(ParamAccess& pa, Stream& stream, const float* x, const float* t, int b,
           double loss_scale, float* loss, bool backward) {
    CpuStream& s = as_cpu_stream(stream, "TiedMlp");
    const Phase fwd = backward ? Phase::kForward : Phase::kEval;
    // Activations of this micro-batch: the stream may still be running the previous one.
    const int layers = layers_;
    auto acts = std::make_shared<std::vector<float>>(
        static_cast<std::size_t>((layers + 1) * b * h_ + b * d_));
    s.enqueue([acts] {});  // keeps them alive until the stream is past this micro-batch
    const DType pt = pa.compute_dtype();
    const DType gt = pa.grad_dtype();
    const int d = d_, h = h_;
    float* h0 = acts->data();  // h_l at h0 + l*b*h
    float* hl = h0 + layers * b * h;
    float* y = hl + b * h;

    pa.acquire(0, fwd);
    {
      const void* w = raw(pa.param(0));
      s.enqueue([=] {
        for (int r = 0; r < b; ++r)
          for (int j = 0; j < h; ++j) {
            float acc = 0.f;
            for (int k = 0; k < d; ++k) acc += x[r * d + k] * load(w, pt, k * h + j);
            h0[r * h + j] = std::tanh(acc);
          }
      });
    }
    pa.release(0, fwd);
    for (int m = 1; m <= layers; ++m) {
      pa.acquire(m, fwd);
      const void* w = raw(pa.param(2 * m - 1));
      const void* bias = raw(pa.param(2 * m));
      const float* in = h0 + (m - 1) * b * h;
      float* out = h0 + m * b * h;
      s.enqueue([=] { dense_tanh(in, w, bias, pt, out, b, h); });
      pa.release(m, fwd);
    }
    const int last = layers + 1;
    pa.acquire(last, fwd);
    {
      const void* w = raw(pa.param(0));
      const void* bo = raw(pa.param(2 * layers + 1));
      s.enqueue([=] {
        double sum = 0.0;
        for (int r = 0; r < b; ++r)
          for (int i = 0; i < d; ++i) {
            float acc = load(bo, pt, i);
            for (int j = 0; j < h; ++j) acc += hl[r * h + j] * load(w, pt, i * h + j);
            y[r * d + i] = acc;
            const double e = static_cast<double>(acc) - t[r * d + i];
            sum += e * e;
          }
        *loss = static_cast<float>(sum / (b * d));
      });
    }
    pa.release(last, fwd);
    if (!backward) {
      s.enqueue([acts] {});
      return;
    }

    // Backward, modules 3..0. Gradients accumulate (+=) into the engine's buffers.
    auto dh = std::make_shared<std::vector<float>>(static_cast<std::size_t>(b * h));
    auto dnext = std::make_shared<std::vector<float>>(static_cast<std::size_t>(b * h));
    const float seed = static_cast<float>(loss_scale) * 2.0f / static_cast<float>(b * d);
    pa.acquire(last, Phase::kBackward);
    {
      const void* w = raw(pa.param(0));
      void* gw = raw(pa.grad(0));
      void* gbo = raw(pa.grad(2 * layers + 1));
      s.enqueue([=] {
        std::vector<float> dy(static_cast<std::size_t>(b * d));
        for (int i = 0; i < b * d; ++i) dy[i] = seed * (y[i] - t[i]);
        for (int i = 0; i < d; ++i) {
          float acc = 0.f;
          for (int r = 0; r < b; ++r) acc += dy[r * d + i];
          add(gbo, gt, i, acc);
          for (int j = 0; j < h; ++j) {
            float g = 0.f;
            for (int r = 0; r < b; ++r) g += dy[r * d + i] * hl[r * h + j];
            add(gw, gt, i * h + j, g);
          }
        }
        for (int r = 0; r < b; ++r)
          for (int j = 0; j < h; ++j) {
            float acc = 0.f;
            for (int i = 0; i < d; ++i) acc += dy[r * d + i] * load(w, pt, i * h + j);
            (*dh)[r * h + j] = acc;
          }
      });
    }
    pa.release(last, Phase::kBackward);
    for (int m = layers; m >= 1; --m) {
      if (recompute_) {
        // Same inputs, same math: the recomputed activations are bit-identical.
        pa.acquire(m, Phase::kRecompute);
        const void* w = raw(pa.param(2 * m - 1));
        const void* bias = raw(pa.param(2 * m));
        const float* in = h0 + (m - 1) * b * h;
        float* out = h0 + m * b * h;
        s.enqueue([=] { dense_tanh(in, w, bias, pt, out, b, h); });
        pa.release(m, Phase::kRecompute);
      }
      pa.acquire(m, Phase::kBackward);
      const void* w = raw(pa.param(2 * m - 1));
      void* gw = raw(pa.grad(2 * m - 1));
      void* gb = raw(pa.grad(2 * m));
      const float* in = h0 + (m - 1) * b * h;
      const float* out = h0 + m * b * h;
      s.enqueue([=] {
        std::vector<float> da(static_cast<std::size_t>(b * h));
        for (int i = 0; i < b * h; ++i) da[i] = (*dh)[i] * (1.f - out[i] * out[i]);
        for (int j = 0; j < h; ++j) {
          float acc = 0.f;
          for (int r = 0; r < b; ++r) acc += da[r * h + j];
          add(gb, gt, j, acc);
        }
        for (int i = 0; i < h; ++i)
          for (int j = 0; j < h; ++j) {
            float g = 0.f;
            for (int r = 0; r < b; ++r) g += in[r * h + i] * da[r * h + j];
            add(gw, gt, i * h + j, g);
          }
        for (int r = 0; r < b; ++r)
          for (int i = 0; i < h; ++i) {
            float acc = 0.f;
            for (int j = 0; j < h; ++j) acc += da[r * h + j] * load(w, pt, i * h + j);
            (*dnext)[r * h + i] = acc;
          }
        std::swap(*dh, *dnext);
      });
      pa.release(m, Phase::kBackward);
    }
    pa.acquire(0, Phase::kBackward);
    {
      void* gw = raw(pa.grad(0));
      s.enqueue([=] {
        for (int k = 0; k < d; ++k)
          for (int j = 0; j < h; ++j) {
            float g = 0.f;
            for (int r = 0; r < b; ++r) {
              g += x[r * d + k] * ((*dh)[r * h + j] * (1.f - h0[r * h + j] * h0[r * h + j]));
            }
            add(gw, gt, k * h + j, g);
          }
      });
    }
    pa.release(0, Phase::kBackward);
    s.enqueue([acts] {});
  }

  template <typename T>
  static T* raw(DevicePtr<T> p) {
    return device_access::raw(p);
  }
  static float load(const void* p, DType t, std::int64_t i) {
    switch (t) {
      case DType::kFloat32:
        return static_cast<const float*>(p)[i];
      case DType::kBFloat16:
        return to_float(static_cast<const bf16*>(p)[i]);
      default:
        return to_float(static_cast<const fp16*>(p)[i]);
    }
  }
  static void add(void* p, DType t, std::int64_t i, float v) {
    switch (t) {
      case DType::kFloat32:
        static_cast<float*>(p)[i] += v;
        break;
      case DType::kBFloat16:
        static_cast<bf16*>(p)[i] = to_bf16(to_float(static_cast<bf16*>(p)[i]) + v);
        break;
      default:
        static_cast<fp16*>(p)[i] = to_fp16(to_float(static_cast<fp16*>(p)[i]) + v);
        break;
    }
  }
  static void dense_tanh(const float* in, const void* w, const void* bias, DType pt, float* out,
                         int b, int h) {
    for (int r = 0; r < b; ++r)
      for (int j = 0; j < h; ++j) {
        float acc = load(bias, pt, j);
        for (int i = 0; i < h; ++i) acc += in[r * h + i] * load(w, pt, i * h + j);
        out[r * h + j] = std::tanh(acc);
      }
  }

  int d_;
  int h_;
  int layers_;
  bool recompute_ = false;
};

// All parameters and gradients in flat buffers: the single-process stand-in for the engine.
class FlatParams final : public ParamAccess {
 public:
  FlatParams(Device& device, const std::vector<ParamSpec>& specs, DType dtype, DType grad_dtype)
      : dtype_(dtype), grad_dtype_(grad_dtype) {
    for (const auto& p : specs) {
      params_.push_back(device.allocate(p.numel() * static_cast<std::int64_t>(dtype_size(dtype)),
                                        MemCategory::kParams, p.name));
      grads_.push_back(
          device.allocate(p.numel() * static_cast<std::int64_t>(dtype_size(grad_dtype)),
                          MemCategory::kGrads, p.name + " grad"));
    }
  }
  void acquire(int, Phase) override {}
  void release(int, Phase) override {}
  DevicePtr<std::byte> param(int i) override {
    return params_[static_cast<std::size_t>(i)].device<std::byte>();
  }
  DevicePtr<std::byte> grad(int i) override {
    return grads_[static_cast<std::size_t>(i)].device<std::byte>();
  }
  DType compute_dtype() const override { return dtype_; }
  DType grad_dtype() const override { return grad_dtype_; }

 private:
  DType dtype_, grad_dtype_;
  std::vector<Buffer> params_, grads_;
};

}  // namespace zrt::test
