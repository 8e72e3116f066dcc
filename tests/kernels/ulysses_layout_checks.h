// The checks of Ulysses sequence parallelism's layout ops (kernels/ulysses_ops.h), on one backend:
// sp ranks are simulated in one process (each rank's chunk, its send blocks, an all-to-all done
// by moving blocks, the receiver's unpack) and every result is compared with what the index
// math of attention says the rank must hold, exactly: the ops only move values, and the one sum
// (the copies of a key/value head in the backward) is recomputed in the same fp32 order. Shared by
// test_ulysses_layout (CPU) and test_cuda_ulysses_layout (GPU, stand-ins).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "kernels/ulysses_ops.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::kernels::ulysses_checks {

using Vec = std::vector<double>;

// A backend's device, stream and kernel context, with host <-> device copies of whole tensors.
struct Backend {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<KernelContext> ctx;
  std::vector<Buffer> keep;

  Backend(DeviceType type, int index) {
    DeviceOptions options;
    options.type = type;
    options.index = index;
    device = make_device(options);
    stream = device->create_stream("compute");
    ctx = std::make_unique<KernelContext>(*device, *stream);
  }
  ~Backend() { stream->synchronize(); }
  Bytes put(const Vec& v, DType dt) {
    const auto bytes = test::encode(v, dt);
    keep.push_back(device->allocate(static_cast<std::int64_t>(bytes.size()) + 16,
                                    MemCategory::kOther, "ulysses-test"));
    const Bytes p = keep.back().device<std::byte>();
    device->copy_to_device(p, bytes.data(), bytes.size(), *stream);
    stream->synchronize();  // `bytes` goes out of scope
    return p;
  }
  Vec get(ConstBytes p, std::size_t n, DType dt) {
    std::vector<std::byte> bytes(n * dtype_size(dt));
    device->copy_to_host(bytes.data(), p, bytes.size(), *stream);
    stream->synchronize();
    return test::decode(bytes, dt);
  }
};

// Values that survive a round trip through `dt` unchanged.
inline Vec values(std::uint64_t stream, std::size_t n, DType dt) {
  return test::decode(test::encode(test::normal_values(99, stream, n), dt), dt);
}

// One shape: B sequences of T = sp*Tl tokens, NH query heads, NKV key/value heads, head size hs.
struct Shape {
  int sp, B, Tl, NH, NKV, hs;
};

// Forward of q (or k/v with `kv`): X (B,T,H,hs) cut into chunks, scattered, moved, gathered;
// rank j must then hold the heads its query heads attend with, in the order its local
// grouped-query attention (NH/sp query heads over Hd key/value heads) expects.
inline void check_forward(Backend& be, DType dt, const Shape& s, bool kv) {
  const UlyssesHeads h = kv ? ulysses_kv_heads(s.NH, s.NKV, s.sp) : ulysses_query_heads(s.NH, s.sp);
  const int T = s.sp * s.Tl, H = h.heads, Hd = h.block_heads, hs = s.hs;
  const Vec X = values(kv ? 2 : 1, static_cast<std::size_t>(s.B) * T * H * hs, dt);
  const std::size_t chunk = static_cast<std::size_t>(s.B) * s.Tl * H * hs;
  const std::size_t block = static_cast<std::size_t>(s.B) * s.Tl * Hd * hs;
  // Send blocks of every rank.
  std::vector<Vec> sent(static_cast<std::size_t>(s.sp));
  for (int r = 0; r < s.sp; ++r) {
    Vec x(chunk);
    for (int b = 0; b < s.B; ++b) {
      for (int t = 0; t < s.Tl; ++t) {
        for (int e = 0; e < H * hs; ++e) {
          x[((static_cast<std::size_t>(b) * s.Tl + t) * H) * hs + e] =
              X[((static_cast<std::size_t>(b) * T + r * s.Tl + t) * H) * hs + e];
        }
      }
    }
    const Bytes in = be.put(x, dt);
    const Bytes out = be.put(Vec(block * s.sp, 0.0), dt);
    ulysses_scatter_heads(*be.ctx, dt, out, in, s.sp, s.B, s.Tl, h, hs);
    sent[static_cast<std::size_t>(r)] = be.get(out, block * s.sp, dt);
  }
  for (int j = 0; j < s.sp; ++j) {
    // The all-to-all: block r of rank j's receive buffer is block j of rank r's send buffer.
    Vec recv(block * s.sp);
    for (int r = 0; r < s.sp; ++r) {
      std::copy_n(
          sent[static_cast<std::size_t>(r)].begin() + static_cast<std::ptrdiff_t>(j * block), block,
          recv.begin() + static_cast<std::ptrdiff_t>(r * block));
    }
    const Bytes in = be.put(recv, dt);
    const Bytes out = be.put(Vec(block * s.sp, 0.0), dt);
    ulysses_gather_sequence(*be.ctx, dt, out, in, s.sp, s.B, s.Tl, Hd, hs);
    const Vec Y = be.get(out, block * s.sp, dt);
    const int nhl = s.NH / s.sp;
    for (int lh = 0; lh < (kv ? nhl : Hd); ++lh) {
      // The global head local head lh stands for (for k/v: the one local query head lh uses,
      // through the local attention's grouping of nhl query heads over Hd key/value heads).
      const int global = kv ? (j * nhl + lh) / (s.NH / s.NKV) : j * nhl + lh;
      const int local = kv ? lh / (nhl / Hd) : lh;
      INFO("sp " << s.sp << " NH " << s.NH << " NKV " << s.NKV << " rank " << j << " local head "
                 << lh << (kv ? " (kv)" : " (q)"));
      for (int b = 0; b < s.B; ++b) {
        for (int t = 0; t < T; ++t) {
          for (int x = 0; x < hs; ++x) {
            const double want = X[((static_cast<std::size_t>(b) * T + t) * H + global) * hs + x];
            const double got = Y[((static_cast<std::size_t>(b) * T + t) * Hd + local) * hs + x];
            if (got != want) {
              FAIL("b " << b << " t " << t << " x " << x << ": " << got << " != " << want);
            }
          }
        }
      }
    }
  }
}

// The way back: attention's output on rank j, O restricted to j's heads (B,T,NH/sp,hs), cut into
// chunks and moved, must come back as every head of the rank's own chunk.
inline void check_output(Backend& be, DType dt, const Shape& s) {
  const int T = s.sp * s.Tl, NH = s.NH, nhl = NH / s.sp, hs = s.hs;
  const Vec O = values(3, static_cast<std::size_t>(s.B) * T * NH * hs, dt);
  const std::size_t block = static_cast<std::size_t>(s.B) * s.Tl * nhl * hs;
  std::vector<Vec> sent(static_cast<std::size_t>(s.sp));
  for (int j = 0; j < s.sp; ++j) {
    Vec o(block * s.sp);
    for (int b = 0; b < s.B; ++b) {
      for (int t = 0; t < T; ++t) {
        for (int e = 0; e < nhl * hs; ++e) {
          o[((static_cast<std::size_t>(b) * T + t) * nhl) * hs + e] =
              O[((static_cast<std::size_t>(b) * T + t) * NH + j * nhl) * hs + e];
        }
      }
    }
    const Bytes in = be.put(o, dt);
    const Bytes out = be.put(Vec(block * s.sp, 0.0), dt);
    ulysses_scatter_sequence(*be.ctx, dt, out, in, s.sp, s.B, s.Tl, nhl, hs);
    sent[static_cast<std::size_t>(j)] = be.get(out, block * s.sp, dt);
  }
  for (int r = 0; r < s.sp; ++r) {
    Vec recv(block * s.sp);
    for (int j = 0; j < s.sp; ++j) {
      std::copy_n(
          sent[static_cast<std::size_t>(j)].begin() + static_cast<std::ptrdiff_t>(r * block), block,
          recv.begin() + static_cast<std::ptrdiff_t>(j * block));
    }
    const Bytes in = be.put(recv, dt);
    const Bytes out = be.put(Vec(block * s.sp, 0.0), dt);
    ulysses_gather_heads(*be.ctx, dt, out, in, s.sp, s.B, s.Tl, nhl, hs);
    const Vec Y = be.get(out, block * s.sp, dt);
    for (int b = 0; b < s.B; ++b) {
      for (int t = 0; t < s.Tl; ++t) {
        for (int e = 0; e < NH * hs; ++e) {
          const double want = O[((static_cast<std::size_t>(b) * T + r * s.Tl + t) * NH) * hs + e];
          const double got = Y[((static_cast<std::size_t>(b) * s.Tl + t) * NH) * hs + e];
          if (got != want) FAIL("rank " << r << " b " << b << " t " << t << " e " << e);
        }
      }
    }
  }
}

// The backward of the key/value path on one rank's chunk: din (initially D0) += the copies the
// ranks' blocks carry, summed in fp32 in ascending block order and rounded once to `dt`.
inline void check_kv_backward(Backend& be, DType dt, const Shape& s) {
  const UlyssesHeads h = ulysses_kv_heads(s.NH, s.NKV, s.sp);
  const int H = h.heads, Hd = h.block_heads, hs = s.hs;
  const std::size_t rows = static_cast<std::size_t>(s.B) * s.Tl;
  const Vec D0 = values(4, rows * H * hs, dt);
  const Vec dY = values(5, rows * Hd * hs * s.sp, dt);
  const Bytes din = be.put(D0, dt);
  ulysses_scatter_heads_backward(*be.ctx, dt, din, be.put(dY, dt), s.sp, s.B, s.Tl, h, hs);
  const Vec got = be.get(din, rows * H * hs, dt);
  std::size_t copies = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    for (int head = 0; head < H; ++head) {
      for (int x = 0; x < hs; ++x) {
        float sum = static_cast<float>(D0[(r * H + head) * hs + x]);
        for (int j = 0; j < s.sp; ++j) {
          const int first = (j * h.heads_per_rank) / h.group;
          if (head < first || head >= first + Hd) continue;
          sum += static_cast<float>(dY[((j * rows + r) * Hd + (head - first)) * hs + x]);
          if (r == 0 && x == 0) ++copies;
        }
        const double want = dt == DType::kFloat32    ? double{sum}
                            : dt == DType::kBFloat16 ? double{to_float(to_bf16(sum))}
                                                     : double{to_float(to_fp16(sum))};
        if (got[(r * H + head) * hs + x] != want)
          FAIL("row " << r << " head " << head << " x " << x);
      }
    }
  }
  // Every block carries Hd heads: sp*Hd copies in all, more than H when NKV < sp.
  CHECK(copies == static_cast<std::size_t>(s.sp) * Hd);
}

inline void check_all(DeviceType type, int index) {
  Backend be(type, index);
  // Query heads split evenly; key/value heads split (NKV >= sp) or copied (NKV < sp, Llama-3-70B's
  // 8 KV heads at sp 16); several blocks of sequence and head per rank.
  const std::vector<Shape> shapes = {{2, 2, 5, 4, 4, 8},  {4, 1, 3, 8, 2, 4}, {4, 2, 4, 8, 8, 6},
                                     {8, 1, 2, 16, 2, 4}, {2, 1, 7, 6, 2, 5}, {1, 2, 3, 4, 1, 4},
                                     {4, 1, 2, 16, 4, 3}};
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const Shape& s : shapes) {
      check_forward(be, dt, s, false);
      check_forward(be, dt, s, true);
      check_output(be, dt, s);
      check_kv_backward(be, dt, s);
    }
  }
}

}  // namespace zrt::kernels::ulysses_checks
