// The multi-node building blocks on the CUDA backend (one GPU per rank; the CUDA stand-ins run it
// on the CPU in CI): the int8 block quantization kernels against their CPU twins bit for bit,
// NCCL sub-groups (ncclCommSplit) with exact collectives and byte counters, and the quantized
// collectives on NCCL against the MPI backend's, bit for bit. Skipped (77) without GPUs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "runtime/comm/cuda_quantize_kernels.h"
#include "runtime/comm/quantize.h"
#include "runtime/comm/quantized_collectives.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device_access.h"
#include "tests/comm/subgroup_checks.h"
#include "tests/support/gpu_test_support.h"

using namespace zrt;
using namespace zrt::test;

namespace {

struct GpuComm {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<ProcessGroup> group;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
};

std::unique_ptr<Device> make_gpu() {
  DeviceOptions o;
  o.type = DeviceType::kCuda;
  o.index = gpu_index();
  return make_device(o);
}

GpuComm make_gpu_comm(const char* name) {
  GpuComm f;
  f.device = make_gpu();
  f.stream = f.device->create_stream(std::string(name) + "-comm");
  f.group = make_process_group(*f.device, MPI_COMM_WORLD, *f.stream, name);
  return f;
}

// Same bits, except that any NaN matches any NaN.
void require_same(const std::vector<std::byte>& got, const std::vector<std::byte>& expect,
                  DType dtype) {
  REQUIRE(got.size() == expect.size());
  for (std::size_t i = 0; i < got.size(); i += dtype_size(dtype)) {
    const float a = element_as_float(got.data() + i, dtype);
    const float b = element_as_float(expect.data() + i, dtype);
    if (std::isnan(a) && std::isnan(b)) continue;
    INFO("byte offset " << i << ": " << a << " vs " << b);
    REQUIRE(std::memcmp(got.data() + i, expect.data() + i, dtype_size(dtype)) == 0);
  }
}

std::vector<std::byte> values(DType dtype, std::int64_t n, unsigned seed, bool poison) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::byte> out(static_cast<std::size_t>(n * esize(dtype)));
  for (std::int64_t i = 0; i < n; ++i) {
    float v = dist(rng) * (i % 3 == 0 ? 1e-3f : 5.0f);
    if (i < 256) v = 0.0f;                                               // an all-zero block
    if (poison && i == 700) v = std::numeric_limits<float>::infinity();  // a non-finite block
    store_float(out.data() + i * esize(dtype), dtype, v);
  }
  return out;
}

}  // namespace

TEST_CASE("CUDA int8 block quantization kernels match the CPU twins bit for bit") {
  auto dev = make_gpu();
  auto s = dev->create_stream("kernel");
  const cudaStream_t cs = cuda_stream_handle(*s);
  using device_access::raw;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t block : {std::int64_t{1}, std::int64_t{256}, std::int64_t{2048}}) {
      const std::int64_t n = 5003;  // a short last block
      const std::int64_t nb = quantized_block_count(n, block);
      const auto x = values(dtype, n, 5, block > 1);
      Buffer d_x = upload(*dev, *s, x);
      Buffer d_q = upload(*dev, *s, {}, n);
      Buffer d_s = upload(*dev, *s, {}, nb * 4);
      Buffer d_out = upload(*dev, *s, {}, n * esize(dtype));
      auto* q = reinterpret_cast<std::int8_t*>(raw(d_q.device<std::byte>()));
      auto* sc = reinterpret_cast<float*>(raw(d_s.device<std::byte>()));
      cuda_quantize_int8_blocks(raw(d_x.device<std::byte>()), dtype, n, block, q, sc, cs);
      cuda_dequantize_int8_blocks(q, sc, n, block, dtype, raw(d_out.device<std::byte>()), cs);
      std::vector<std::int8_t> cq(static_cast<std::size_t>(n));
      std::vector<float> cs_host(static_cast<std::size_t>(nb));
      quantize_int8_blocks(x.data(), dtype, n, block, cq.data(), cs_host.data());
      std::vector<std::byte> cout(static_cast<std::size_t>(n * esize(dtype)));
      dequantize_int8_blocks(cq.data(), cs_host.data(), n, block, dtype, cout.data());
      INFO(dtype_name(dtype) << " block " << block);
      const auto gq = download(*dev, *s, d_q.device<std::byte>(), n);
      REQUIRE(std::memcmp(gq.data(), cq.data(), static_cast<std::size_t>(n)) == 0);
      std::vector<std::byte> cs_bytes(static_cast<std::size_t>(nb * 4));
      std::memcpy(cs_bytes.data(), cs_host.data(), cs_bytes.size());
      require_same(download(*dev, *s, d_s.device<std::byte>(), nb * 4), cs_bytes, DType::kFloat32);
      require_same(download(*dev, *s, d_out.device<std::byte>(), n * esize(dtype)), cout, dtype);
      // Accumulate in fp32 and narrow with a divisor.
      Buffer d_acc = upload(*dev, *s, {}, n * 4);
      auto* acc = reinterpret_cast<float*>(raw(d_acc.device<std::byte>()));
      cuda_dequantize_int8_blocks_add(q, sc, n, block, acc, false, cs);
      cuda_dequantize_int8_blocks_add(q, sc, n, block, acc, true, cs);
      cuda_narrow_fp32(acc, n, 3.0f, dtype, raw(d_out.device<std::byte>()), cs);
      std::vector<float> cacc(static_cast<std::size_t>(n));
      dequantize_int8_blocks_add(cq.data(), cs_host.data(), n, block, cacc.data(), false);
      dequantize_int8_blocks_add(cq.data(), cs_host.data(), n, block, cacc.data(), true);
      narrow_fp32(cacc.data(), n, 3.0f, dtype, cout.data());
      require_same(download(*dev, *s, d_out.device<std::byte>(), n * esize(dtype)), cout, dtype);
    }
  }
}

TEST_CASE("NCCL sub-groups (ncclCommSplit): node, inter-node, shard and replica, exact") {
  auto f = make_gpu_comm("world");
  if (f.size() < 4 || f.size() % 2 != 0) return;  // ctest runs it at 4 ranks
  check_subgroups(f, f.size() / 2, 2);
}

TEST_CASE("quantized collectives on NCCL equal the MPI backend's bit for bit") {
  auto g = make_gpu_comm("nccl");
  auto c = make_comm({}, "mpi");
  const int n = g.size();
  if (n < 4 || n % 2 != 0) return;  // ctest runs it at 4 ranks: 2 nodes x 2
  const NodeTopology topo(n, n / 2);
  auto groups = [&](auto& fixture, std::unique_ptr<ProcessGroup>* intra,
                    std::unique_ptr<ProcessGroup>* inter) {
    fixture.group->set_node_map(topo.node_map());
    *intra = make_subgroup(*fixture.group, intra_node_plan(topo.node_map(), fixture.rank()),
                           *fixture.stream, "intra");
    *inter = make_subgroup(*fixture.group, inter_node_plan(topo.node_map(), fixture.rank()),
                           *fixture.stream, "inter");
  };
  std::unique_ptr<ProcessGroup> gi, ge, ci, ce;
  groups(g, &gi, &ge);
  groups(c, &ci, &ce);
  QuantizedCollectives gq(*g.device, *g.group, gi.get(), ge.get(), 256);
  QuantizedCollectives cq(*c.device, *c.group, ci.get(), ce.get(), 256);
  const std::int64_t count = 1000;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const std::int64_t e = esize(dtype);
    const auto input = make_input(dtype, g.rank(), 0, n * count, 31);
    Buffer gin = upload(*g.device, *g.stream, input);
    Buffer cin = upload(*c.device, *c.stream, input);
    Buffer gout = upload(*g.device, *g.stream, {}, n * count * e);
    Buffer cout = upload(*c.device, *c.stream, {}, n * count * e);
    gq.reduce_scatter(gin.device<std::byte>(), gout.device<std::byte>(), count, dtype,
                      ReduceOp::kAvg);
    cq.reduce_scatter(cin.device<std::byte>(), cout.device<std::byte>(), count, dtype,
                      ReduceOp::kAvg);
    INFO(dtype_name(dtype));
    require_same(download(*g.device, *g.stream, gout.device<std::byte>(), count * e),
                 download(*c.device, *c.stream, cout.device<std::byte>(), count * e), dtype);
    gq.all_gather(gin.device<std::byte>(), gout.device<std::byte>(), count, dtype);
    cq.all_gather(cin.device<std::byte>(), cout.device<std::byte>(), count, dtype);
    require_same(download(*g.device, *g.stream, gout.device<std::byte>(), n * count * e),
                 download(*c.device, *c.stream, cout.device<std::byte>(), n * count * e), dtype);
  }
  // The same bytes crossed the (simulated) nodes on both backends.
  CHECK(ge->stats().snapshot().total_inter_bytes() == ce->stats().snapshot().total_inter_bytes());
  CHECK(gi->stats().snapshot().total_intra_bytes() == ci->stats().snapshot().total_intra_bytes());
}
