// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final xor ~0), the
// checksum zrt checkpoints store per dataset block. HDF5's own Fletcher-32 filter needs chunked
// datasets; checkpoint datasets are contiguous, so the checksum is ours.
//
// crc32c() uses the SSE4.2 crc32 instruction when the CPU has it (about 8 bytes per cycle with
// three interleaved streams) and a portable slicing-by-8 table otherwise; both give the same
// value. Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrt::checkpoint {

// The CRC-32C of `bytes` bytes at `data`, continuing from `crc` (0 for a fresh checksum):
// crc32c(b, n2, crc32c(a, n1)) == crc32c(a ++ b, n1 + n2).
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);

// The portable implementation alone (tests compare it with the hardware one).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc = 0);

// True when crc32c() uses the crc32 instruction on this CPU.
bool crc32c_hardware();

}  // namespace zrt::checkpoint
