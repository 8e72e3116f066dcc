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

// The raw register after feeding `zeros` zero bytes from register c, as four 256-entry tables:
// feeding data is linear in the register, so shift(c) = xor of the tables' rows for c's bytes.
// Combines three CRC streams computed side by side (hardware_raw below).
class ZeroShift {
 public:
  explicit ZeroShift(std::size_t zeros) {
    std::uint32_t basis[32];
    for (int bit = 0; bit < 32; ++bit) {
      std::uint32_t c = 1u << bit;
      for (std::size_t i = 0; i < zeros; ++i) c = (c >> 8) ^ tables().t[0][c & 0xFFu];
      basis[bit] = c;
    }
    for (int k = 0; k < 4; ++k) {
      for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t v = 0;
        for (int i = 0; i < 8; ++i) {
          if (b & (1u << i)) v ^= basis[8 * k + i];
        }
        t_[k][b] = v;
      }
    }
  }
  std::uint32_t operator()(std::uint32_t c) const {
    return t_[0][c & 0xFF] ^ t_[1][(c >> 8) & 0xFF] ^ t_[2][(c >> 16) & 0xFF] ^ t_[3][c >> 24];
  }

 private:
  std::uint32_t t_[4][256];
};

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles and a throughput of one per cycle: one
// dependent chain runs at a third of the unit's speed. Three independent streams over
// consecutive lanes of kLane bytes keep it busy; their registers are combined with ZeroShift
// (register(A ++ B) = shift(register(A), |B|) ^ register_from_zero(B)).
constexpr std::size_t kLane = 4096;

const ZeroShift& shift_lane() {
  static const ZeroShift s(kLane);  // immutable after construction
  return s;
}

__attribute__((target("sse4.2"))) std::uint64_t crc_words(std::uint64_t c, const unsigned char* p,
                                                          std::size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  return c;
}

__attribute__((target("sse4.2"))) std::uint32_t hardware_raw(const unsigned char* p, std::size_t n,
                                                             std::uint32_t c) {
  std::uint64_t c64 = c;
  if (n >= 3 * kLane) {
    const ZeroShift& shift = shift_lane();
    while (n >= 3 * kLane) {
      std::uint64_t a = c64, b = 0, d = 0;
      const unsigned char* pb = p + kLane;
      const unsigned char* pd = p + 2 * kLane;
      for (std::size_t i = 0; i < kLane; i += 8) {
        std::uint64_t wa, wb, wd;
        std::memcpy(&wa, p + i, 8);
        std::memcpy(&wb, pb + i, 8);
        std::memcpy(&wd, pd + i, 8);
        a = __builtin_ia32_crc32di(a, wa);
        b = __builtin_ia32_crc32di(b, wb);
        d = __builtin_ia32_crc32di(d, wd);
      }
      const std::uint32_t ab = shift(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b);
      c64 = shift(ab) ^ static_cast<std::uint32_t>(d);
      p += 3 * kLane;
      n -= 3 * kLane;
    }
  }
  c64 = crc_words(c64, p, n);
  p += n & ~std::size_t{7};
  n &= 7;
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
