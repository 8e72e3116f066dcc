// Little-endian 32-bit words as the shard formats store them on disk (token_shard.h,
// sft_shard.h), read and written byte by byte so the host's byte order does not matter.
#pragma once

#include <cstdint>
#include <cstring>

namespace zrt {

inline std::int32_t load_le_i32(const std::uint8_t* p) {
  const std::uint32_t u =
      static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
      (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
  std::int32_t v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

inline void store_le_i32(std::uint8_t* p, std::int32_t v) {
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(u >> (8 * i));
}

}  // namespace zrt
