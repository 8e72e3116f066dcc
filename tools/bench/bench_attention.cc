// zrt-bench attention: causal attention forward and forward+backward time of kernels/ops.h (on a
// GPU the fused tensor-core kernels where they take the shape, head size 64 or 128, and the
// batched cuBLAS path they replace) next to PyTorch's scaled_dot_product_attention on the same
// device, shapes and dtype (tools/bench/torch_attention_bench.py, FlashAttention-2's kernel on a
// GPU), and the tensor throughput each reaches. With --documents K it also times the same shapes
// with K equal documents packed into each sequence (doc_start, kernels/ops.h), beside the causal
// call: the attention a packed fine-tuning step costs. --window W gives every zrt call a sliding
// window of W tokens (kernels/ops.h; torch's SDPA takes none, so its columns are then skipped).
// A shape with a fifth number, B,T,NH,hs,NKV,
// is grouped-query attention (gqa_attention_*, NKV key/value heads): on a GPU it also times the
// packed path (KernelOptions::cuda_gqa_packed) the in-place fused kernels replace, and PyTorch's
// SDPA gets NKV key/value heads (enable_gqa). Times are medians over --iters of the wall
// time of one call enqueued and its stream drained, after two warm-up calls (torch's likewise).
// On the CPU two more columns: the CPU attention's path for the shape (kernels/cpu/
// attention_path.h; ZRT_CPU_ATTENTION=full or tiled forces one) and its peak workspace, the
// backward's (what ops.cc allocates for it).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/kernel_context.h"
#if ZRT_HAVE_CUDA
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cudnn_attention.h"
#endif
#include "kernels/ops.h"
#include "models/init_rng.h"
#include "runtime/common/dtype.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"
#include "tools/bench/bench.h"

namespace zrt::bench {

namespace {

struct Shape {
  int B, T, NH, hs;
  int NKV = 0;     // key/value heads of grouped-query attention; 0: multi-head attention (qkv)
  int window = 0;  // --window: every zrt call's sliding window (kernels/ops.h); 0: none
};

// "B,T,NH,hs;B,T,NH,hs,NKV;..."
std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> shapes;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ';')) {
    if (item.empty()) continue;
    Shape s{};
    char c1 = 0, c2 = 0, c3 = 0, c4 = 0;
    std::stringstream one(item);
    if (!(one >> s.B >> c1 >> s.T >> c2 >> s.NH >> c3 >> s.hs) || c1 != ',' || c2 != ',' ||
        c3 != ',' || s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.hs <= 0 ||
        (one >> c4 && (c4 != ',' || !(one >> s.NKV) || s.NKV <= 0 || s.NH % s.NKV != 0)) ||
        !(one >> std::ws).eof()) {
      ZRT_THROW(InvalidArgument,
                "--shapes: '{}' is not B,T,NH,hs or B,T,NH,hs,NKV (positive integers, NKV "
                "dividing NH)",
                item);
    }
    shapes.push_back(s);
  }
  if (shapes.empty()) ZRT_THROW(InvalidArgument, "--shapes: no shape in '{}'", text);
  return shapes;
}

// Causal attention's tensor work, as FlashAttention's papers count it: the forward's two
// products over the lower triangle, 4 B NH T^2 hs / 2; the backward 2.5 times that (five
// products, one of them the recomputed scores).
double forward_flops(const Shape& s) {
  return 2.0 * s.B * s.NH * static_cast<double>(s.T) * s.T * s.hs;
}

struct Timing {
  double forward_s = 0, forward_backward_s = 0;
  bool declined = false;  // cuDNN attention asked for and not taken (zrt's kernels ran)
};

// A buffer of `n` elements of `dtype` on `device`, N(0, 1) values from `stream_id`.
Buffer random_buffer(Device& device, Stream& stream, DType dtype, std::int64_t n, int stream_id) {
  std::vector<std::byte> host(static_cast<std::size_t>(n) * dtype_size(dtype));
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(
        counter_normal(11, static_cast<std::uint64_t>(stream_id), static_cast<std::uint64_t>(i)));
    std::byte* p = host.data() + i * static_cast<std::int64_t>(dtype_size(dtype));
    switch (dtype) {
      case DType::kBFloat16: {
        const bf16 h = to_bf16(v);
        std::memcpy(p, &h, sizeof h);
        break;
      }
      case DType::kFloat16: {
        const fp16 h = to_fp16(v);
        std::memcpy(p, &h, sizeof h);
        break;
      }
      case DType::kFloat32:
        std::memcpy(p, &v, sizeof v);
        break;
      default:
        ZRT_THROW(InvalidArgument, "--dtype {}: bf16, fp16 or fp32", dtype_name(dtype));
    }
  }
  Buffer b = device.allocate(static_cast<std::int64_t>(host.size()), MemCategory::kOther,
                             "bench attention");
  device.copy_to_device(b.device<std::byte>(), host.data(), host.size(), stream);
  stream.synchronize();  // the copy reads `host`, which ends here
  return b;
}

// doc_start (B,T) of `documents` equal documents per sequence (the last takes what T / documents
// leaves over); empty for one.
std::vector<std::int32_t> document_starts(const Shape& s, int documents) {
  std::vector<std::int32_t> starts;
  if (documents <= 1) return starts;
  const int length = s.T / documents;
  for (int b = 0; b < s.B; ++b) {
    for (int t = 0; t < s.T; ++t) starts.push_back(std::min(t / length, documents - 1) * length);
  }
  return starts;
}

// gqa_packed: grouped-query shapes by packing q and the repeated k, v (the CUDA path the in-place
// fused kernels replace). pipelined: the fused mma kernels' pipelined variant (else the staged
// one, whatever ZRT_CUDA_ATTENTION says). cudnn: 1 cuDNN's attention with its deterministic
// backward, 2 with its non-deterministic one (0: zrt's kernels).
Timing run_zrt(DeviceType type, DType dtype, const Shape& s, int iters,
               kernels::FusedAttention fused, int documents = 1, bool gqa_packed = false,
               bool pipelined = false, int cudnn = 0) {
  DeviceOptions options;
  options.type = type;
  auto device = make_device(options);
  auto stream = device->create_stream("compute");
  kernels::KernelOptions kernel_options;
  kernel_options.cuda_fused_attention = fused;
  kernel_options.cuda_gqa_packed = gqa_packed;
  kernel_options.cuda_attention_pipelined = pipelined;
  kernel_options.cuda_attention_cudnn = cudnn > 0;
  kernel_options.cuda_attention_cudnn_deterministic = cudnn != 2;
  kernel_options.cuda_attention_cudnn_required = cudnn > 0;
  kernel_options.cuda_attention_cudnn_workspace_limit = 0;  // timed at any workspace
  kernels::KernelContext ctx(*device, *stream, kernel_options);
  const int C = s.NH * s.hs;
  const std::int64_t n = static_cast<std::int64_t>(s.B) * s.T * C;
  // Multi-head: q, k, v packed in one (B,T,3C) tensor, as GPT's attention takes them. Grouped-
  // query: q (B,T,C), then k and v (B,T,NKV*hs) each, in one buffer (and their gradients).
  const std::int64_t kv = s.NKV > 0 ? static_cast<std::int64_t>(s.B) * s.T * s.NKV * s.hs : n;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dtype));
  Buffer qkv = random_buffer(*device, *stream, dtype, n + 2 * kv, 1);
  Buffer dout = random_buffer(*device, *stream, dtype, n, 2);
  Buffer out = device->allocate(n * es, MemCategory::kOther, "bench attention out");
  Buffer dqkv = device->allocate((n + 2 * kv) * es, MemCategory::kOther, "bench attention dqkv");
  const kernels::Bytes q = qkv.device<std::byte>();
  const kernels::Bytes dq = dqkv.device<std::byte>();
  Buffer lse = device->allocate(static_cast<std::int64_t>(s.B) * s.NH * s.T * 4,
                                MemCategory::kOther, "bench attention lse");
  const std::vector<std::int32_t> starts = document_starts(s, documents);
  Buffer doc_buffer;
  kernels::ConstTokens doc_start;  // null: one document per sequence
  if (!starts.empty()) {
    const std::size_t bytes = starts.size() * sizeof(std::int32_t);
    doc_buffer = device->allocate(static_cast<std::int64_t>(bytes), MemCategory::kOther,
                                  "bench attention doc_start");
    device->copy_to_device(doc_buffer.device<std::byte>(), starts.data(), bytes, *stream);
    stream->synchronize();  // the copy reads `starts`
    doc_start = doc_buffer.device<const std::int32_t>();
  }
  auto forward = [&] {
    if (s.NKV > 0) {
      kernels::gqa_attention_forward(ctx, dtype, out.device<std::byte>(), lse.device<float>(), q,
                                     q + n * es, q + (n + kv) * es, s.B, s.T, s.NH, s.NKV, s.hs,
                                     doc_start, s.window);
      return;
    }
    kernels::attention_forward(ctx, dtype, out.device<std::byte>(), lse.device<float>(), q, s.B,
                               s.T, C, s.NH, doc_start, s.window);
  };
  // On a GPU the gradients are written as the models ask (GradWrite::kIntoZeros: cuDNN writes
  // them in place); their values do not matter to the timing, so they are not zeroed between
  // calls. The CPU backend checks that promise, so there the backward accumulates.
  const kernels::GradWrite write =
      type == DeviceType::kCuda ? kernels::GradWrite::kIntoZeros : kernels::GradWrite::kAccumulate;
  auto backward = [&] {
    if (s.NKV > 0) {
      kernels::gqa_attention_backward(ctx, dtype, dq, dq + n * es, dq + (n + kv) * es,
                                      dout.device<std::byte>(), q, q + n * es, q + (n + kv) * es,
                                      out.device<std::byte>(), lse.device<float>(), s.B, s.T, s.NH,
                                      s.NKV, s.hs, doc_start, s.window, write);
      return;
    }
    kernels::attention_backward(ctx, dtype, dq, dout.device<std::byte>(), q,
                                out.device<std::byte>(), lse.device<float>(), s.B, s.T, C, s.NH,
                                doc_start, s.window, write);
  };
  auto time = [&](bool with_backward) {
    std::vector<double> samples;
    for (int i = 0; i < iters + 2; ++i) {
      const auto start = std::chrono::steady_clock::now();
      forward();
      if (with_backward) backward();
      stream->synchronize();
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (i >= 2) samples.push_back(sec);  // the first calls allocate workspace and warm up
    }
    return median(samples);
  };
  Timing t;
  t.forward_s = time(false);
  t.forward_backward_s = time(true);
#if ZRT_HAVE_CUDA
  if (cudnn > 0) {
    t.declined =
        ctx.cuda()->cudnn_attention_forwards == 0 || ctx.cuda()->cudnn_attention_backwards == 0;
  }
#endif
  return t;
}

// PyTorch's times for the same shape, or zeros when unavailable.
Timing run_torch(const std::string& python, const std::string& script, DeviceType type, DType dtype,
                 const Shape& s, int iters) {
  Timing t;
  if (python.empty()) return t;
  const std::string line = run_capture(
      fmt::format("'{}' '{}' --device {} --dtype {} --batch {} --seq {} --heads {} --head-size {} "
                  "--kv-heads {} --iters {} 2>/dev/null",
                  python, script, type == DeviceType::kCuda ? "cuda" : "cpu", dtype_name(dtype),
                  s.B, s.T, s.NH, s.hs, s.NKV > 0 ? s.NKV : s.NH, iters));
  const auto f = line.find("forward_ms="), fb = line.find("forward_backward_ms=");
  if (f == std::string::npos || fb == std::string::npos) return t;
  t.forward_s = std::stod(line.substr(f + 11)) / 1e3;
  t.forward_backward_s = std::stod(line.substr(fb + 20)) / 1e3;
  return t;
}

// The CPU attention's path and the bytes of its backward workspace (its larger) for a shape.
std::pair<std::string, double> cpu_attention_workspace(DType dtype, const Shape& s) {
  namespace cpu = kernels::cpu;
  const int C = s.NH * s.hs;
  const auto bytes = [&](auto storage) {
    using S = decltype(storage);
    const std::int64_t count =
        s.NKV > 0 ? cpu::gqa_attention_backward_workspace<S>(s.B, s.T, s.NH, s.NKV, s.hs)
                  : cpu::attention_backward_workspace<S>(s.B, s.T, C, s.NH);
    return static_cast<double>(count) * sizeof(cpu::acc_t<S>);
  };
  const double ws = dtype == DType::kBFloat16  ? bytes(bf16{})
                    : dtype == DType::kFloat16 ? bytes(fp16{})
                                               : bytes(float{});
  const cpu::AttentionPath path =
      cpu::resolve_attention_path(cpu::AttentionPath::kAuto, s.B, s.T, s.NH, sizeof(float));
  return {cpu::attention_path_name(path), ws};
}

std::string tflops(double flops, double seconds) {
  return seconds > 0 ? fmt::format("{:.3g}", flops / seconds / 1e12) : "-";
}

}  // namespace

int attention(int argc, char** argv) {
  Args args(argc, argv,
            {"device", "dtype", "shapes", "iters", "documents", "window", "no-torch", "python",
             "torch-script", "help"});
  if (args.has("help")) {
    std::printf(
        "zrt-bench attention [--device cuda|cpu] [--dtype bf16] [--shapes "
        "\"B,T,NH,hs[,NKV];...\"]\n"
        "                    [--iters 20] [--documents K] [--window W] [--no-torch] [--python "
        "PATH]\n"
        "Causal attention forward and forward+backward: zrt's kernels (on a GPU also the\n"
        "batched-GEMM path the fused kernels replace) next to PyTorch's\n"
        "scaled_dot_product_attention on the same device (flash kernel on a GPU), with the\n"
        "TFLOP/s each reaches. --documents K also times each shape with K equal documents\n"
        "packed into every sequence (doc_start), beside the causal call (K documents are about\n"
        "1/K of the causal attention work). --window W: a sliding window of W tokens on\n"
        "every zrt call (torch's SDPA takes none: its columns are skipped). A fifth number NKV "
        "makes the shape grouped-query\n"
        "attention with NKV key/value heads (Llama-3 8B: 1,4096,32,128,8); on a GPU its packed\n"
        "path (q and the repeated k, v in one tensor) is timed beside the in-place one.\n"
        "On a GPU the zrt columns are the staged fused kernels; the piped columns their\n"
        "pipelined variant (ZRT_CUDA_ATTENTION=pipelined), timed right after them; where the\n"
        "build has cuDNN attention, the cudnn columns are cuDNN's fused attention with its\n"
        "deterministic backward (ZRT_CUDA_ATTENTION=cudnn) and cudnn_nd with its atomic one\n"
        "(cudnn-nondeterministic); \"declined\" where cuDNN does not take the shape.\n"
        "Defaults: cuda when a GPU is found, bf16, GPT-2 124M's shape (8,1024,12,64) and\n"
        "Llama-3 8B's at 4k tokens (1,4096,32,128).\n");
    return 0;
  }
  const DeviceType type = args.get("device", cuda_device_count() > 0 ? "cuda" : "cpu") == "cuda"
                              ? DeviceType::kCuda
                              : DeviceType::kCpu;
  const DType dtype = parse_dtype(args.get("dtype", "bf16"));
  std::vector<Shape> shapes =
      parse_shapes(args.get("shapes", type == DeviceType::kCuda ? "8,1024,12,64;1,4096,32,128"
                                                                : "1,256,4,64;1,256,2,128"));
  const int iters = static_cast<int>(args.get_double("iters", 20));
  const int documents = static_cast<int>(args.get_double("documents", 1));
  if (documents < 1) ZRT_THROW(InvalidArgument, "--documents {}: at least 1", documents);
  for (const Shape& s : shapes) {
    if (documents > s.T) {
      ZRT_THROW(InvalidArgument, "--documents {}: more than the {} tokens of a sequence", documents,
                s.T);
    }
  }
  const int window = static_cast<int>(args.get_double("window", 0));
  if (window < 0) ZRT_THROW(InvalidArgument, "--window {}: at least 0 (0: none)", window);
  for (Shape& s : shapes) s.window = window;
  // torch's SDPA takes no sliding window: its columns would time another attention.
  const bool no_torch = args.has("no-torch") || window > 0;
  const std::string python = no_torch ? "" : find_python(args.get("python", ""));
  const std::string script =
      args.get("torch-script", "").empty()
          ? find_script("torch_attention_bench.py", ZRT_TORCH_ATTENTION_SCRIPT)
          : args.get("torch-script", "");
  std::printf("# zrt-bench attention: causal, %s, %s; median of %d calls after 2 warm-ups\n",
              type == DeviceType::kCuda ? "cuda" : "cpu", dtype_name(dtype), iters);
  std::printf("# TFLOP/s: forward 4*B*NH*T^2*hs/2, backward 2.5x that; torch: %s\n",
              window > 0             ? "skipped (--window: SDPA takes no window)"
              : args.has("no-torch") ? "skipped (--no-torch)"
              : python.empty()       ? "not available (no python3 with torch)"
                                     : (python + " " + script).c_str());
  const bool cuda = type == DeviceType::kCuda;
  const bool packed = documents > 1;
  const bool grouped =
      cuda && std::any_of(shapes.begin(), shapes.end(), [](const Shape& s) { return s.NKV > 0; });
  if (packed) {
    std::printf("# --documents %d: each sequence packs %d equal documents (doc_start)\n", documents,
                documents);
  }
  if (window > 0)
    std::printf("# --window %d: every zrt call has a sliding window of %d\n", window, window);
  std::vector<std::string> header = {"B,T,NH,hs",   "zrt_fwd_ms",         "zrt_fwd+bwd_ms",
                                     "zrt_TFLOP/s", "batched_fwd+bwd_ms", "batched/zrt_time"};
  if (cuda) {
    for (const char* h : {"piped_fwd_ms", "piped_fwd+bwd_ms", "piped_TFLOP/s", "zrt/piped_time"}) {
      header.push_back(h);
    }
  }
#if ZRT_HAVE_CUDA
  const bool with_cudnn = cuda && kernels::cuda::cudnn_attention_built();
#else
  const bool with_cudnn = false;
#endif
  if (with_cudnn) {
    for (const char* h : {"cudnn_fwd_ms", "cudnn_fwd+bwd_ms", "cudnn_TFLOP/s", "zrt/cudnn_time",
                          "cudnn_nd_fwd+bwd_ms", "torch/cudnn_time"}) {
      header.push_back(h);
    }
  }
  if (grouped) {
    header.push_back("gqa_packed_fwd+bwd_ms");
    header.push_back("packed/zrt_time");
  }
  if (packed) {
    for (const char* h : {"docs_fwd_ms", "docs_fwd+bwd_ms", "docs/causal_time"}) {
      header.push_back(h);
    }
  }
  for (const char* h : {"torch_fwd_ms", "torch_fwd+bwd_ms", "torch_TFLOP/s", "torch/zrt_time"}) {
    header.push_back(h);
  }
  if (!cuda) {
    header.push_back("cpu_path");
    header.push_back("cpu_ws_MiB");
  }
  Table table(header);
  for (const Shape& s : shapes) {
    const Timing z = run_zrt(type, dtype, s, iters, kernels::FusedAttention::kAll);
    // The same shape, K documents a sequence, on the same path; timed right after the causal call.
    const Timing d = packed
                         ? run_zrt(type, dtype, s, iters, kernels::FusedAttention::kAll, documents)
                         : Timing{};
    // The pipelined fused kernels, right after the staged ones (CUDA only).
    const Timing p =
        cuda ? run_zrt(type, dtype, s, iters, kernels::FusedAttention::kAll, 1, false, true)
             : Timing{};
    // cuDNN's attention, deterministic then not (CUDA builds that have it).
    const Timing c = with_cudnn ? run_zrt(type, dtype, s, iters, kernels::FusedAttention::kAll, 1,
                                          false, false, 1)
                                : Timing{};
    const Timing cn = with_cudnn ? run_zrt(type, dtype, s, iters, kernels::FusedAttention::kAll, 1,
                                           false, false, 2)
                                 : Timing{};
    // The batched cuBLAS path the fused kernels replace (CUDA only: the CPU has one path).
    const Timing b =
        cuda ? run_zrt(type, dtype, s, iters, kernels::FusedAttention::kNone) : Timing{};
    // Grouped-query attention's packed path (GPU only: the CPU's is chosen by its own rule).
    const Timing g = grouped && s.NKV > 0
                         ? run_zrt(type, dtype, s, iters, kernels::FusedAttention::kAll, 1, true)
                         : Timing{};
    const Timing t = run_torch(python, script, type, dtype, s, iters);
    const double flops = forward_flops(s) * 3.5;
    std::vector<std::string> row = {
        s.NKV > 0 ? fmt::format("{},{},{},{},{}", s.B, s.T, s.NH, s.hs, s.NKV)
                  : fmt::format("{},{},{},{}", s.B, s.T, s.NH, s.hs),
        fmt::format("{:.3f}", z.forward_s * 1e3),
        fmt::format("{:.3f}", z.forward_backward_s * 1e3),
        tflops(flops, z.forward_backward_s),
        b.forward_backward_s > 0 ? fmt::format("{:.3f}", b.forward_backward_s * 1e3) : "-",
        b.forward_backward_s > 0
            ? fmt::format("{:.2f}", b.forward_backward_s / z.forward_backward_s)
            : "-"};
    if (cuda) {
      row.push_back(fmt::format("{:.3f}", p.forward_s * 1e3));
      row.push_back(fmt::format("{:.3f}", p.forward_backward_s * 1e3));
      row.push_back(tflops(flops, p.forward_backward_s));
      row.push_back(p.forward_backward_s > 0
                        ? fmt::format("{:.2f}", z.forward_backward_s / p.forward_backward_s)
                        : "-");
    }
    if (with_cudnn) {
      if (c.declined) {
        for (int i = 0; i < 4; ++i) row.push_back("declined");
      } else {
        row.push_back(fmt::format("{:.3f}", c.forward_s * 1e3));
        row.push_back(fmt::format("{:.3f}", c.forward_backward_s * 1e3));
        row.push_back(tflops(flops, c.forward_backward_s));
        row.push_back(fmt::format("{:.2f}", z.forward_backward_s / c.forward_backward_s));
      }
      row.push_back(cn.declined ? "declined" : fmt::format("{:.3f}", cn.forward_backward_s * 1e3));
      row.push_back(t.forward_backward_s > 0 && !c.declined
                        ? fmt::format("{:.2f}", t.forward_backward_s / c.forward_backward_s)
                        : "-");
    }
    if (grouped) {
      row.push_back(g.forward_backward_s > 0 ? fmt::format("{:.3f}", g.forward_backward_s * 1e3)
                                             : "-");
      row.push_back(g.forward_backward_s > 0
                        ? fmt::format("{:.2f}", g.forward_backward_s / z.forward_backward_s)
                        : "-");
    }
    if (packed) {
      row.push_back(fmt::format("{:.3f}", d.forward_s * 1e3));
      row.push_back(fmt::format("{:.3f}", d.forward_backward_s * 1e3));
      row.push_back(fmt::format("{:.3f}", d.forward_backward_s / z.forward_backward_s));
    }
    row.push_back(t.forward_s > 0 ? fmt::format("{:.3f}", t.forward_s * 1e3) : "-");
    row.push_back(t.forward_backward_s > 0 ? fmt::format("{:.3f}", t.forward_backward_s * 1e3)
                                           : "-");
    row.push_back(tflops(flops, t.forward_backward_s));
    row.push_back(t.forward_backward_s > 0
                      ? fmt::format("{:.2f}", t.forward_backward_s / z.forward_backward_s)
                      : "-");
    if (!cuda) {
      const auto [path, ws] = cpu_attention_workspace(dtype, s);
      row.push_back(path);
      row.push_back(fmt::format("{:.2f}", ws / (1 << 20)));
    }
    table.add(row);
    std::fflush(stdout);
  }
  std::printf("%s", table.str().c_str());
  return 0;
}

}  // namespace zrt::bench
