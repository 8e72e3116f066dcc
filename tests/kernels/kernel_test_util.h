// Helpers shared by the kernel and model tests: deterministic inputs from the counter RNG (the
// same keys tests/golden/gen_gpt_golden.py uses), the golden file, error measures, packed
// documents.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/kernel_context.h"
#include "models/init_rng.h"
#include "runtime/common/dtype.h"
#include "runtime/common/error.h"

namespace zrt::test {

// CUDA attention for the GPU tests, whatever ZRT_CUDA_ATTENTION's default picks (cuDNN's
// attention where the build has it): zrt's own kernels, for the cases that check them against
// their CPU twins, and cuDNN's asked for by name at any workspace, for the cases that check it.
inline kernels::KernelOptions own_attention_kernels() {
  kernels::KernelOptions options;
  options.cuda_attention_cudnn = false;
  options.cuda_attention_cudnn_required = false;
  return options;
}
inline kernels::KernelOptions cudnn_attention_kernels() {
  kernels::KernelOptions options;
  options.cuda_attention_cudnn = true;
  options.cuda_attention_cudnn_required = true;
  options.cuda_attention_cudnn_workspace_limit = 0;
  return options;
}

constexpr std::uint64_t kLayerSeed = 20240601;  // LAYER_SEED in gen_gpt_golden.py

// float32(offset + scale * normal(seed, stream, i)), widened to double.
inline std::vector<double> normal_values(std::uint64_t seed, std::uint64_t stream, std::size_t n,
                                         double scale = 1.0, double offset = 0.0) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(offset + scale * counter_normal(seed, stream, i));
  }
  return v;
}

inline std::vector<std::int32_t> token_values(std::uint64_t seed, std::uint64_t stream,
                                              std::size_t n, int vocab) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<std::int32_t>(counter_hash(seed, stream, i) %
                                     static_cast<std::uint64_t>(vocab));
  }
  return v;
}

// Packed documents (kernels/ops.h): sequence b of T tokens holds documents of lengths[b] (summing
// to T), in order. doc_start[b*T+t] is the first token of t's document, positions[b*T+t] its
// position in it; spans lists each document as (b, first token, length).
struct Packing {
  struct Span {
    int b, begin, length;
  };
  std::vector<std::int32_t> doc_start, positions;
  std::vector<Span> spans;
};

inline Packing pack_documents(const std::vector<std::vector<int>>& lengths, int T) {
  Packing p;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    int begin = 0;
    for (int length : lengths[b]) {
      ZRT_CHECK(length > 0, "empty document");
      p.spans.push_back({static_cast<int>(b), begin, length});
      for (int i = 0; i < length; ++i) {
        p.doc_start.push_back(begin);
        p.positions.push_back(i);
      }
      begin += length;
    }
    ZRT_CHECK(begin == T, "documents of sequence {} take {} tokens, not T = {}", b, begin, T);
  }
  return p;
}

template <typename T>
std::vector<T> cast_vector(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return out;
}

template <typename S>
std::vector<S> to_storage(const std::vector<double>& v) {
  std::vector<S> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
      out[i] = static_cast<S>(v[i]);
    } else {
      out[i] = store_from_float<S>(static_cast<float>(v[i]));
    }
  }
  return out;
}

template <typename S>
std::vector<double> to_double(const std::vector<S>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
      out[i] = static_cast<double>(v[i]);
    } else {
      out[i] = static_cast<double>(to_float(v[i]));
    }
  }
  return out;
}

// ||a - b|| / ||b|| (absolute ||a - b|| when b is all zero).
template <typename A, typename B>
double rel_error(const std::vector<A>& a, const std::vector<B>& b) {
  ZRT_CHECK(a.size() == b.size(), "sizes {} and {}", a.size(), b.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    ref += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

inline std::vector<std::uint8_t> base64_decode(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<std::uint8_t> out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::uint8_t>((acc >> bits) & 0xffu));
    }
  }
  return out;
}

// A base64 little-endian float32 tensor from the golden file, widened to double.
inline std::vector<double> golden_tensor(const nlohmann::json& j) {
  const auto bytes = base64_decode(j.get<std::string>());
  std::vector<double> out(bytes.size() / 4);
  for (std::size_t i = 0; i < out.size(); ++i) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    out[i] = f;
  }
  return out;
}

inline const nlohmann::json& golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_GPT_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_GPT_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}

// v as the bytes of dtype dt (fp32, bf16 or fp16, rounded to nearest even).
inline std::vector<std::byte> encode(const std::vector<double>& v, DType dt) {
  std::vector<std::byte> out(v.size() * dtype_size(dt));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    if (dt == DType::kFloat32) {
      std::memcpy(&out[i * 4], &f, 4);
    } else if (dt == DType::kBFloat16) {
      const bf16 h = to_bf16(f);
      std::memcpy(&out[i * 2], &h, 2);
    } else {
      const fp16 h = to_fp16(f);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

// The values of bytes of dtype dt, widened to double.
inline std::vector<double> decode(const std::vector<std::byte>& bytes, DType dt) {
  std::vector<double> v(bytes.size() / dtype_size(dt));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kFloat32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      v[i] = f;
    } else if (dt == DType::kBFloat16) {
      bf16 h;
      std::memcpy(&h, &bytes[i * 2], 2);
      v[i] = to_float(h);
    } else {
      fp16 h;
      std::memcpy(&h, &bytes[i * 2], 2);
      v[i] = to_float(h);
    }
  }
  return v;
}

}  // namespace zrt::test
