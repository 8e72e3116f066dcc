// Helpers for collective tests: deterministic per-rank inputs and device round trips.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/comm/process_group.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device.h"

namespace zrt::test {

struct CommFixture {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<ProcessGroup> group;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
};

inline CommFixture make_comm(const CommOptions& options = {}, const char* name = "world") {
  CommFixture f;
  f.device = make_device(DeviceOptions{});
  f.stream = f.device->create_stream(std::string(name) + "-comm");
  f.group = make_process_group(*f.device, MPI_COMM_WORLD, *f.stream, name, options);
  return f;
}

// A value in [-1, 1) that depends only on (rank, index, salt): every rank can compute every
// other rank's input.
inline float input_value(int rank, std::int64_t i, int salt) {
  std::uint64_t x = (static_cast<std::uint64_t>(rank) << 40) ^ static_cast<std::uint64_t>(i) ^
                    (static_cast<std::uint64_t>(salt) << 56);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// count elements of dtype holding input_value(rank, first + i, salt) (integers: small ints).
inline std::vector<std::byte> make_input(DType dtype, int rank, std::int64_t first,
                                         std::int64_t count, int salt) {
  std::vector<std::byte> out(static_cast<std::size_t>(count) * dtype_size(dtype));
  for (std::int64_t i = 0; i < count; ++i) {
    const float v = input_value(rank, first + i, salt);
    std::byte* dst = out.data() + i * static_cast<std::int64_t>(dtype_size(dtype));
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(dst, &v, 4);
        break;
      case DType::kBFloat16: {
        const bf16 h = to_bf16(v);
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::kFloat16: {
        const fp16 h = to_fp16(v);
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::kInt32: {
        const auto n = static_cast<std::int32_t>(v * 1000);
        std::memcpy(dst, &n, 4);
        break;
      }
      case DType::kInt64: {
        const auto n = static_cast<std::int64_t>(v * 1e12);
        std::memcpy(dst, &n, 8);
        break;
      }
    }
  }
  return out;
}

inline float element_as_float(const std::byte* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBFloat16: {
      bf16 h;
      std::memcpy(&h, p, 2);
      return to_float(h);
    }
    case DType::kFloat16: {
      fp16 h;
      std::memcpy(&h, p, 2);
      return to_float(h);
    }
    default:
      return 0.0f;
  }
}

inline void store_float(std::byte* p, DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(p, &v, 4);
      break;
    case DType::kBFloat16: {
      const bf16 h = to_bf16(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kFloat16: {
      const fp16 h = to_fp16(v);
      std::memcpy(p, &h, 2);
      break;
    }
    default:
      break;
  }
}

inline Buffer upload(Device& dev, Stream& s, const std::vector<std::byte>& host,
                     std::int64_t bytes = -1) {
  const std::int64_t size = bytes < 0 ? static_cast<std::int64_t>(host.size()) : bytes;
  Buffer b = dev.allocate(size, MemCategory::kComm, "test buffer");
  if (!host.empty()) dev.copy_to_device(b.device<std::byte>(), host.data(), host.size(), s);
  s.synchronize();
  return b;
}

inline std::vector<std::byte> download(Device& dev, Stream& s, DevicePtr<const std::byte> p,
                                       std::int64_t bytes) {
  std::vector<std::byte> out(static_cast<std::size_t>(bytes));
  dev.copy_to_host(out.data(), p, out.size(), s);
  s.synchronize();
  return out;
}

inline std::int64_t esize(DType t) {
  return static_cast<std::int64_t>(dtype_size(t));
}

// All-gather of every rank's deterministic input, in or out of place, checked bit for bit.
// Fixture: any of the tests' group fixtures (device, stream, group, rank(), size()).
template <typename Fixture>
void check_all_gather(Fixture& f, DType dtype, std::int64_t count, bool in_place) {
  const int world = f.size();
  const int salt = 11;
  const auto mine = make_input(dtype, f.rank(), 0, count, salt);
  const std::int64_t out_bytes = world * count * esize(dtype);
  Buffer out = upload(*f.device, *f.stream, {}, out_bytes);
  Buffer in;
  DevicePtr<const std::byte> src;
  if (in_place) {
    f.device->copy_to_device(out.device<std::byte>() + f.rank() * count * esize(dtype), mine.data(),
                             mine.size(), *f.stream);
    src = out.device<std::byte>() + f.rank() * count * esize(dtype);
  } else {
    in = upload(*f.device, *f.stream, mine);
    src = in.device<std::byte>();
  }
  f.group->all_gather(src, out.device<std::byte>(), count, dtype);
  const auto got = download(*f.device, *f.stream, out.device<std::byte>(), out_bytes);
  for (int r = 0; r < world; ++r) {
    const auto expect = make_input(dtype, r, 0, count, salt);
    INFO("rank " << r << " dtype " << dtype_name(dtype) << " count " << count);
    REQUIRE(std::memcmp(got.data() + r * count * esize(dtype), expect.data(), expect.size()) == 0);
  }
}

}  // namespace zrt::test
