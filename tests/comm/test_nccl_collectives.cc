// The NCCL backend at the world size mpirun gives (ctest runs 1 and 2 ranks, one GPU per rank):
// every collective, dtype and op against the serial reference test_collectives.cc uses (fp32
// sums in rank order), bit for bit, and against the MPI backend run on the same inputs in the
// same process. Also the CUDA reduction kernel against its CPU twin, byte counters, argument
// checks, split, and the timeout of a collective a peer never joins. Skipped (exit 77) where
// the ranks have no GPU each.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/comm/cuda_reduce_kernels.h"
#include "runtime/comm/nccl_process_group.h"
#include "runtime/comm/reduce_kernels.h"
#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device_access.h"
#include "tests/comm/collective_test_util.h"
#include "tests/support/gpu_test_support.h"

using namespace zrt;
using namespace zrt::test;

namespace {

const DType kFloatTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
const std::int64_t kCounts[] = {1, 7, 1000, 4099};

struct GpuComm {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<ProcessGroup> group;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
  NcclProcessGroup& nccl() { return dynamic_cast<NcclProcessGroup&>(*group); }
};

std::unique_ptr<Device> make_gpu() {
  DeviceOptions o;
  o.type = DeviceType::kCuda;
  o.index = gpu_index();
  return make_device(o);
}

GpuComm make_gpu_comm(const CommOptions& options = {}, const char* name = "world") {
  GpuComm f;
  f.device = make_gpu();
  f.stream = f.device->create_stream(std::string(name) + "-comm");
  f.group = make_process_group(*f.device, MPI_COMM_WORLD, *f.stream, name, options);
  return f;
}

// Bitwise equality of two arrays of dtype, except that NaN matches any NaN (x86 and CUDA
// propagate NaN payloads differently; dtype.h only promises that NaN stays NaN).
void require_same_bits(const std::vector<std::byte>& got, const std::vector<std::byte>& expect,
                       DType dtype, const char* what) {
  REQUIRE(got.size() == expect.size());
  const std::int64_t n = static_cast<std::int64_t>(got.size()) / esize(dtype);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::byte* g = got.data() + i * esize(dtype);
    const std::byte* e = expect.data() + i * esize(dtype);
    if (std::memcmp(g, e, dtype_size(dtype)) == 0) continue;
    if (is_floating(dtype) && std::isnan(element_as_float(g, dtype)) &&
        std::isnan(element_as_float(e, dtype))) {
      continue;
    }
    INFO(what << ": element " << i << " of " << n << ", dtype " << dtype_name(dtype) << ": got "
              << element_as_float(g, dtype) << ", expected " << element_as_float(e, dtype));
    REQUIRE(std::memcmp(g, e, dtype_size(dtype)) == 0);
  }
}

// The CPU twin's answer: op over the world's inputs (salt) at elements [first, first+count) of
// each rank's full input, reduced by reduce_blocks in rank order.
std::vector<std::byte> cpu_reduce(DType dtype, int world, std::int64_t first, std::int64_t count,
                                  int salt, ReduceOp op) {
  std::vector<std::byte> blocks;
  for (int r = 0; r < world; ++r) {
    const auto mine = make_input(dtype, r, first, count, salt);
    blocks.insert(blocks.end(), mine.begin(), mine.end());
  }
  std::vector<std::byte> out(static_cast<std::size_t>(count * esize(dtype)));
  if (count > 0) reduce_blocks(blocks.data(), count, world, count, dtype, op, out.data());
  return out;
}

// A serial double-precision reference, to check the fp32 rank-order sums are the right sums.
void check_close_to_serial(const std::vector<std::byte>& got, DType dtype, int world,
                           std::int64_t first, int salt, ReduceOp op) {
  const double eps = dtype == DType::kFloat32 ? 1e-6 : dtype == DType::kBFloat16 ? 1e-2 : 2e-3;
  const std::int64_t n = static_cast<std::int64_t>(got.size()) / esize(dtype);
  for (std::int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    double magnitude = 0.0;
    for (int r = 0; r < world; ++r) {
      const auto one = make_input(dtype, r, first + i, 1, salt);
      const double v = element_as_float(one.data(), dtype);
      sum += v;
      magnitude += std::fabs(v);
    }
    if (op == ReduceOp::kAvg) {
      sum /= world;
      magnitude /= world;
    }
    REQUIRE(std::fabs(element_as_float(got.data() + i * esize(dtype), dtype) - sum) <=
            eps * (magnitude + 1e-3));
  }
}

void check_reduce_scatter(GpuComm& f, DType dtype, std::int64_t count, ReduceOp op, bool in_place) {
  const int world = f.size();
  const int salt = 23;
  const auto full = make_input(dtype, f.rank(), 0, world * count, salt);
  Buffer in = upload(*f.device, *f.stream, full);
  Buffer separate;
  DevicePtr<std::byte> dst = in.device<std::byte>() + f.rank() * count * esize(dtype);
  if (!in_place) {
    separate = upload(*f.device, *f.stream, {}, count * esize(dtype));
    dst = separate.device<std::byte>();
  }
  f.group->reduce_scatter(in.device<std::byte>(), dst, count, dtype, op);
  const auto got = download(*f.device, *f.stream, dst, count * esize(dtype));
  INFO("reduce_scatter " << reduce_op_name(op) << " count " << count << " in place " << in_place);
  require_same_bits(got, cpu_reduce(dtype, world, f.rank() * count, count, salt, op), dtype,
                    "reduce_scatter");
  check_close_to_serial(got, dtype, world, f.rank() * count, salt, op);
}

void check_all_reduce_float(GpuComm& f, DType dtype, std::int64_t count, ReduceOp op,
                            bool in_place) {
  const int salt = 37;
  Buffer in = upload(*f.device, *f.stream, make_input(dtype, f.rank(), 0, count, salt));
  Buffer out;
  DevicePtr<std::byte> dst = in.device<std::byte>();
  if (!in_place) {
    out = upload(*f.device, *f.stream, {}, count * esize(dtype));
    dst = out.device<std::byte>();
  }
  f.group->all_reduce(in.device<std::byte>(), dst, count, dtype, op);
  const auto got = download(*f.device, *f.stream, dst, count * esize(dtype));
  INFO("all_reduce " << reduce_op_name(op) << " count " << count << " in place " << in_place);
  require_same_bits(got, cpu_reduce(dtype, f.size(), 0, count, salt, op), dtype, "all_reduce");
  check_close_to_serial(got, dtype, f.size(), 0, salt, op);
}

template <typename Int>
void check_all_reduce_int(GpuComm& f, DType dtype, std::int64_t count, ReduceOp op) {
  const int salt = 41;
  Buffer buf = upload(*f.device, *f.stream, make_input(dtype, f.rank(), 0, count, salt));
  f.group->all_reduce(buf.device<std::byte>(), buf.device<std::byte>(), count, dtype, op);
  const auto got = download(*f.device, *f.stream, buf.device<std::byte>(), count * esize(dtype));
  REQUIRE(got == cpu_reduce(dtype, f.size(), 0, count, salt, op));
}

void run_all_float_cases(GpuComm& f) {
  for (DType dtype : kFloatTypes) {
    for (std::int64_t count : kCounts) {
      for (bool in_place : {false, true}) {
        check_all_gather(f, dtype, count, in_place);
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          check_reduce_scatter(f, dtype, count, op, in_place);
          check_all_reduce_float(f, dtype, count, op, in_place);
        }
      }
    }
  }
}

// Random bit patterns (every class of value: subnormals, infinities, NaNs, rounding ties) and,
// for fp32, also ordinary values, whose sums do not just return the largest operand.
std::vector<std::byte> kernel_input(DType dtype, std::int64_t n, std::mt19937_64& rng) {
  std::vector<std::byte> out(static_cast<std::size_t>(n * esize(dtype)));
  for (std::int64_t i = 0; i < n; ++i) {
    std::byte* p = out.data() + i * esize(dtype);
    const std::uint64_t bits = rng();
    switch (dtype) {
      case DType::kFloat32: {
        float v = bits_float(static_cast<std::uint32_t>(bits));
        if (bits >> 62 != 0) v = input_value(0, static_cast<std::int64_t>(bits >> 8), 3) * 70000.0f;
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kBFloat16:
      case DType::kFloat16: {
        std::uint16_t h = static_cast<std::uint16_t>(bits);
        if (bits >> 62 != 0) {  // mostly moderate exponents, so sums round rather than saturate
          h = static_cast<std::uint16_t>((h & 0x83ffu) |
                                         (dtype == DType::kFloat16 ? 0x3800u : 0x3f00u));
        }
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kInt32: {
        const auto v =
            static_cast<std::int32_t>(static_cast<std::int64_t>(bits % 2000001) - 1000000);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kInt64: {
        const auto v = static_cast<std::int64_t>(bits >> 8) - (std::int64_t{1} << 55);
        std::memcpy(p, &v, 8);
        break;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("cuda_reduce_blocks matches reduce_blocks bit for bit") {
  auto dev = make_gpu();
  auto s = dev->create_stream("kernel");
  std::mt19937_64 rng(1234);
  const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt32,
                          DType::kInt64};
  for (DType dtype : kTypes) {
    const ReduceOp ops[2] = {ReduceOp::kSum, is_floating(dtype) ? ReduceOp::kAvg : ReduceOp::kMax};
    for (int nblocks : {1, 2, 3, 8}) {
      for (std::int64_t count : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{70001}}) {
        const std::int64_t stride = count + 5;  // blocks need not be contiguous
        const auto blocks = kernel_input(dtype, nblocks * stride, rng);
        Buffer d_blocks = upload(*dev, *s, blocks);
        Buffer d_out = upload(*dev, *s, {}, count * esize(dtype));
        for (ReduceOp op : ops) {
          cuda_reduce_blocks(device_access::raw(d_blocks.device<std::byte>()), stride, nblocks,
                             count, dtype, op, device_access::raw(d_out.device<std::byte>()),
                             cuda_stream_handle(*s));
          const auto got = download(*dev, *s, d_out.device<std::byte>(), count * esize(dtype));
          std::vector<std::byte> expect(got.size());
          reduce_blocks(blocks.data(), stride, nblocks, count, dtype, op, expect.data());
          INFO(dtype_name(dtype) << " " << reduce_op_name(op) << " nblocks " << nblocks << " count "
                                 << count);
          require_same_bits(got, expect, dtype, "cuda_reduce_blocks");
        }
      }
    }
  }
  CHECK_THROWS_WITH(cuda_reduce_blocks(nullptr, 4, 2, 4, DType::kInt32, ReduceOp::kAvg, nullptr,
                                       cuda_stream_handle(*s)),
                    Catch::Contains("avg is not defined on int32"));
  CHECK_THROWS_WITH(cuda_reduce_blocks(nullptr, 4, 2, 4, DType::kBFloat16, ReduceOp::kMax, nullptr,
                                       cuda_stream_handle(*s)),
                    Catch::Contains("max is not supported on bf16"));
}

TEST_CASE("NCCL all_gather, reduce_scatter and all_reduce match the CPU reference bit for bit") {
  auto f = make_gpu_comm();
  run_all_float_cases(f);
}

TEST_CASE("chunked NCCL operations (tiny max_chunk_bytes) match the CPU reference") {
  CommOptions o;
  o.max_chunk_bytes = 256;  // many all-to-all rounds and scratch reuse for every larger count
  auto f = make_gpu_comm(o, "chunked");
  run_all_float_cases(f);
}

TEST_CASE("the NCCL and MPI backends give bit-identical results on the same inputs") {
  auto g = make_gpu_comm({}, "nccl");
  auto c = make_comm({}, "mpi");  // the CPU backend, over the same ranks
  const std::int64_t count = 10007;
  for (DType dtype : kFloatTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      const auto mine = make_input(dtype, g.rank(), 0, count, 59);
      Buffer gb = upload(*g.device, *g.stream, mine);
      Buffer cb = upload(*c.device, *c.stream, mine);
      g.group->all_reduce(gb.device<std::byte>(), gb.device<std::byte>(), count, dtype, op);
      c.group->all_reduce(cb.device<std::byte>(), cb.device<std::byte>(), count, dtype, op);
      const auto from_gpu =
          download(*g.device, *g.stream, gb.device<std::byte>(), count * esize(dtype));
      const auto from_cpu =
          download(*c.device, *c.stream, cb.device<std::byte>(), count * esize(dtype));
      INFO(dtype_name(dtype) << " " << reduce_op_name(op));
      require_same_bits(from_gpu, from_cpu, dtype, "NCCL vs MPI all_reduce");
    }
  }
}

TEST_CASE("NCCL integer all_reduce sum and max, broadcast from every root, barrier") {
  auto f = make_gpu_comm();
  for (std::int64_t count : kCounts) {
    check_all_reduce_int<std::int32_t>(f, DType::kInt32, count, ReduceOp::kSum);
    check_all_reduce_int<std::int32_t>(f, DType::kInt32, count, ReduceOp::kMax);
    check_all_reduce_int<std::int64_t>(f, DType::kInt64, count, ReduceOp::kSum);
    check_all_reduce_int<std::int64_t>(f, DType::kInt64, count, ReduceOp::kMax);
  }
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    for (int root = 0; root < f.size(); ++root) {
      const std::int64_t count = 777;
      Buffer buf = upload(*f.device, *f.stream, make_input(dtype, f.rank(), 0, count, 5));
      f.group->broadcast(buf.device<std::byte>(), count, dtype, root);
      const auto got =
          download(*f.device, *f.stream, buf.device<std::byte>(), count * esize(dtype));
      REQUIRE(got == make_input(dtype, root, 0, count, 5));
    }
  }
  f.group->barrier();
  f.nccl().synchronize();
  f.nccl().check_async_error();
}

TEST_CASE("the native NCCL reduce-scatter gives the same fp32 sums within rounding") {
  CommOptions o;
  o.reduce_scatter_algo = ReduceScatterAlgo::kNative;
  auto f = make_gpu_comm(o, "native");
  for (std::int64_t count : kCounts) {
    for (bool in_place : {false, true}) {
      const int salt = 23;
      const auto full = make_input(DType::kFloat32, f.rank(), 0, f.size() * count, salt);
      Buffer in = upload(*f.device, *f.stream, full);
      Buffer out = upload(*f.device, *f.stream, {}, count * 4);
      DevicePtr<std::byte> dst =
          in_place ? in.device<std::byte>() + f.rank() * count * 4 : out.device<std::byte>();
      f.group->reduce_scatter(in.device<std::byte>(), dst, count, DType::kFloat32, ReduceOp::kSum);
      const auto got = download(*f.device, *f.stream, dst, count * 4);
      check_close_to_serial(got, DType::kFloat32, f.size(), f.rank() * count, salt, ReduceOp::kSum);
    }
  }
  CHECK_THROWS_WITH(f.group->reduce_scatter(DevicePtr<const std::byte>(), DevicePtr<std::byte>(), 8,
                                            DType::kBFloat16, ReduceOp::kSum),
                    Catch::Contains("native NCCL reduce-scatter would sum bf16"));
}

TEST_CASE("NCCL byte counters follow nccl-tests' definitions exactly") {
  auto f = make_gpu_comm({}, "counted");
  const int n = f.size();
  Buffer a = upload(*f.device, *f.stream, {}, 4096 * n * 4);
  Buffer b = upload(*f.device, *f.stream, {}, 4096 * n * 4);
  f.device->fill_zero(a.device<std::byte>(), 4096 * n * 4, *f.stream);
  f.group->all_gather(a.device<std::byte>(), b.device<std::byte>(), 1000, DType::kBFloat16);
  f.group->reduce_scatter(a.device<std::byte>(), b.device<std::byte>(), 1001, DType::kFloat32,
                          ReduceOp::kSum);
  f.group->all_reduce(a.device<std::byte>(), a.device<std::byte>(), 999, DType::kFloat16,
                      ReduceOp::kAvg);
  f.group->all_reduce(a.device<std::byte>(), a.device<std::byte>(), 3, DType::kInt64,
                      ReduceOp::kMax);
  f.group->broadcast(a.device<std::byte>(), 10, DType::kInt32, 0);
  f.group->barrier();
  f.nccl().synchronize();
  const CommCounts c = f.group->stats().snapshot();
  CHECK(c.calls[static_cast<int>(CollectiveOp::kAllGather)] == 1);
  CHECK(c.bytes[static_cast<int>(CollectiveOp::kAllGather)] ==
        collective_bytes(CollectiveOp::kAllGather, 1000, DType::kBFloat16, n));
  CHECK(c.bytes[static_cast<int>(CollectiveOp::kAllGather)] == 1000 * 2 * n);
  CHECK(c.bytes[static_cast<int>(CollectiveOp::kReduceScatter)] == 1001 * 4 * n);
  CHECK(c.calls[static_cast<int>(CollectiveOp::kAllReduce)] == 2);
  CHECK(c.bytes[static_cast<int>(CollectiveOp::kAllReduce)] == 999 * 2 + 3 * 8);
  CHECK(c.bytes[static_cast<int>(CollectiveOp::kBroadcast)] == 40);
  CHECK(c.calls[static_cast<int>(CollectiveOp::kBarrier)] == 1);
  CHECK(c.bytes[static_cast<int>(CollectiveOp::kBarrier)] == 0);
  CHECK(c.total_bytes() == 1000 * 2 * n + 1001 * 4 * n + 999 * 2 + 24 + 40);
}

TEST_CASE("bad NCCL arguments are rejected on the calling thread with the operation named") {
  auto f = make_gpu_comm({}, "checked");
  Buffer a = upload(*f.device, *f.stream, {}, 1024);
  CHECK_THROWS_WITH(f.group->all_reduce(a.device<std::byte>(), a.device<std::byte>(), 4,
                                        DType::kFloat32, ReduceOp::kMax),
                    Catch::Contains("all_reduce on fp32 supports sum and avg, not max"));
  CHECK_THROWS_WITH(f.group->reduce_scatter(a.device<std::byte>(), a.device<std::byte>(), 4,
                                            DType::kInt32, ReduceOp::kAvg),
                    Catch::Contains("reduce_scatter supports sum"));
  CHECK_THROWS_WITH(f.group->broadcast(a.device<std::byte>(), 4, DType::kInt32, f.size()),
                    Catch::Contains("broadcast root"));
  if (f.size() > 1) {
    CHECK_THROWS_WITH(
        f.group->all_gather(a.device<std::byte>() + 4, a.device<std::byte>(), 8, DType::kFloat32),
        Catch::Contains("overlaps the output"));
  }
  // Validation failures leave the communicator healthy.
  f.group->barrier();
  f.nccl().synchronize();
}

TEST_CASE("split NCCL groups reduce within their colour") {
  auto f = make_gpu_comm({}, "parent");
  auto sub_stream = f.device->create_stream("sub");
  const int color = f.rank() % 2;
  auto sub = f.group->split(color, f.rank(), *sub_stream, "parity");
  const int expected_size = (f.size() + 1 - color) / 2;
  REQUIRE(sub->size() == expected_size);
  CHECK(sub->rank() == f.rank() / 2);
  std::vector<std::byte> one(8);
  const std::int64_t mine = f.rank() + 1;
  std::memcpy(one.data(), &mine, 8);
  Buffer b = upload(*f.device, *sub_stream, one);
  sub->all_reduce(b.device<std::byte>(), b.device<std::byte>(), 1, DType::kInt64, ReduceOp::kSum);
  const auto got = download(*f.device, *sub_stream, b.device<std::byte>(), 8);
  std::int64_t sum = 0;
  std::memcpy(&sum, got.data(), 8);
  std::int64_t expect = 0;
  for (int r = color; r < f.size(); r += 2) expect += r + 1;
  CHECK(sum == expect);

  // Reversed keys reverse the ranks.
  auto rev_stream = f.device->create_stream("reversed");
  auto rev = f.group->split(0, f.size() - 1 - f.rank(), *rev_stream, "reversed");
  CHECK(rev->rank() == f.size() - 1 - f.rank());
  CHECK_THROWS_WITH(f.group->split(-1, 0, *rev_stream, "none"), Catch::Contains("colour"));
}

// Last: it leaves rank 0's communicator aborted. Rank 0 issues an all-gather that rank 1 never
// joins, so the NCCL kernel (or the connection set-up before it) waits forever; the bounded wait
// must abort the communicator and throw Timeout naming the operation.
TEST_CASE("a collective a peer never joins times out and aborts the communicator", "[timeout]") {
  CommOptions o;
  o.timeout_s = 3.0;
  auto f = make_gpu_comm(o, "stalled");
  if (f.size() < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  Buffer in = upload(*f.device, *f.stream, {}, 1024 * 4);
  Buffer out = upload(*f.device, *f.stream, {}, 1024 * 4 * f.size());
  if (f.rank() == 0) {
    auto stall = [&] {
      f.group->all_gather(in.device<std::byte>(), out.device<std::byte>(), 1024, DType::kFloat32);
      f.nccl().synchronize();
    };
    CHECK_THROWS_AS(stall(), Timeout);
    CHECK(f.nccl().comm() == nullptr);
    CHECK_THROWS_WITH(f.group->barrier(), Catch::Contains("aborted"));
  }
  f.group.reset();  // rank 1: finalizing without its peer also ends within the timeout
  MPI_Barrier(MPI_COMM_WORLD);
}
