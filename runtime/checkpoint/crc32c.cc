#include "runtime/checkpoint/crc32c.h"

#include <array>
#include <cstring>

namespace zrt::checkpoint {

namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  Tables() {
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (std::uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    }
  }
};

const Tables& tables() {
  static const Tables tables;  // immutable after construction
  return tables;
}

std::uint32_t portable_raw(const unsigned char* p, std::size_t n, std::uint32_t c) {
  const auto& t = tables().t;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (x86-64, aarch64)
    word ^= c;
    c = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^
        t[4][(word >> 24) & 0xFF] ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^
        t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t hardware_raw(const unsigned char* p, std::size_t n,
                                                             std::uint32_t c) {
  std::uint64_t c64 = c;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = __builtin_ia32_crc32di(c64, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c64);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
bool detect_hardware() {
  return __builtin_cpu_supports("sse4.2");
}
#else
std::uint32_t hardware_raw(const unsigned char* p, std::size_t n, std::uint32_t c) {
  return portable_raw(p, n, c);
}
bool detect_hardware() {
  return false;
}
#endif

}  // namespace

bool crc32c_hardware() {
  static const bool has = detect_hardware();
  return has;
}

std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc) {
  return ~portable_raw(static_cast<const unsigned char*>(data), bytes, ~crc);
}

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) {
  if (!crc32c_hardware()) return crc32c_portable(data, bytes, crc);
  return ~hardware_raw(static_cast<const unsigned char*>(data), bytes, ~crc);
}

}  // namespace zrt::checkpoint
