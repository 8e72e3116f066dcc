// FNV-1a, 64-bit: a small non-cryptographic hash for identities compared, not defended (the
// collective sequence check's running hash, the data fingerprint a resume compares).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrt {

constexpr std::uint64_t kFnv1aOffsetBasis = 14695981039346656037ULL;
constexpr std::uint64_t kFnv1aPrime = 1099511628211ULL;

// `hash` continued over n bytes at `data` (start from kFnv1aOffsetBasis).
inline std::uint64_t fnv1a(std::uint64_t hash, const void* data, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    hash ^= bytes[i];
    hash *= kFnv1aPrime;
  }
  return hash;
}

}  // namespace zrt
