// The host-staged group (ranks sharing a device: MPI over pinned host memory) against the plain
// MPI group on the same inputs: every collective, every dtype, in place and not, a sub-group
// from split, the byte counters, and the stream order (an operation sees what was enqueued on
// the stream before it, and work enqueued after it sees its result). Results must be
// bit-identical: the staged group runs the same MPI algorithms on copies of the same bytes.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/comm/mpi_process_group.h"
#include "runtime/comm/staged_process_group.h"
#include "tests/comm/collective_test_util.h"

namespace zrt {
namespace {

using test::make_input;

struct Pair {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> plain_stream = device->create_stream("plain");
  std::unique_ptr<Stream> staged_stream = device->create_stream("staged");
  std::unique_ptr<ProcessGroup> plain;
  std::unique_ptr<ProcessGroup> staged;
  Pair() {
    CommOptions options;
    options.timeout_s = 60;
    plain = make_process_group(*device, MPI_COMM_WORLD, *plain_stream, "plain", options);
    options.host_staged = true;
    staged = make_process_group(*device, MPI_COMM_WORLD, *staged_stream, "staged", options);
    REQUIRE(dynamic_cast<StagedProcessGroup*>(staged.get()) != nullptr);
  }

  // Runs `op(group, in, out)` on both groups with `in` uploaded and `out_bytes` of output
  // (initialised to `out_init`), and returns both outputs.
  template <typename Op>
  std::pair<std::vector<std::byte>, std::vector<std::byte>> both(
      const std::vector<std::byte>& in, const std::vector<std::byte>& out_init, Op&& op) {
    std::vector<std::byte> results[2];
    ProcessGroup* groups[2] = {plain.get(), staged.get()};
    for (int k = 0; k < 2; ++k) {
      Stream& s = groups[k]->stream();
      Buffer bin =
          device->allocate(static_cast<std::int64_t>(in.size() + 64), MemCategory::kOther, "in");
      Buffer bout = device->allocate(static_cast<std::int64_t>(out_init.size() + 64),
                                     MemCategory::kOther, "out");
      if (!in.empty()) device->copy_to_device(bin.device<std::byte>(), in.data(), in.size(), s);
      if (!out_init.empty()) {
        device->copy_to_device(bout.device<std::byte>(), out_init.data(), out_init.size(), s);
      }
      op(*groups[k], bin.device<std::byte>(), bout.device<std::byte>());
      results[k].resize(out_init.size());
      if (!out_init.empty()) {
        device->copy_to_host(results[k].data(), bout.device<std::byte>(), out_init.size(), s);
      }
      s.synchronize();
    }
    return {results[0], results[1]};
  }
};

TEST_CASE("staged collectives equal the MPI group's, bit for bit", "[comm][staged]") {
  Pair p;
  const int n = p.plain->size();
  const int r = p.plain->rank();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{70001}}) {
      const std::size_t es = dtype_size(dtype);
      INFO("dtype " << dtype_name(dtype) << ", count " << count << ", " << n << " ranks");
      const auto one = make_input(dtype, r, 0, count, 1);
      const auto all = make_input(dtype, r, 0, count * n, 2);
      std::vector<std::byte> zeros(count * es), zeros_n(count * n * es);

      auto ag = p.both(one, zeros_n, [&](ProcessGroup& g, auto in, auto out) {
        g.all_gather(in, out, count, dtype);
      });
      CHECK(ag.first == ag.second);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto rs = p.both(all, zeros, [&](ProcessGroup& g, auto in, auto out) {
          g.reduce_scatter(in, out, count, dtype, op);
        });
        CHECK(rs.first == rs.second);
        auto ar = p.both(one, zeros, [&](ProcessGroup& g, auto in, auto out) {
          g.all_reduce(in, out, count, dtype, op);
        });
        CHECK(ar.first == ar.second);
        // In place: out == in.
        auto ar_in_place = p.both(one, one, [&](ProcessGroup& g, auto, auto out) {
          g.all_reduce(out, out, count, dtype, op);
        });
        CHECK(ar_in_place.first == ar_in_place.second);
        CHECK(ar_in_place.first == ar.first);
      }
      auto a2a = p.both(all, zeros_n, [&](ProcessGroup& g, auto in, auto out) {
        g.all_to_all(in, out, count, dtype);
      });
      CHECK(a2a.first == a2a.second);
      auto bc = p.both(
          {}, one, [&](ProcessGroup& g, auto, auto out) { g.broadcast(out, count, dtype, n - 1); });
      CHECK(bc.first == bc.second);
      // In-place all-gather: this rank's slice already in place.
      std::vector<std::byte> placed(zeros_n);
      std::memcpy(placed.data() + r * count * es, one.data(), one.size());
      auto ag_in_place = p.both({}, placed, [&](ProcessGroup& g, auto, auto out) {
        g.all_gather(out + r * count * static_cast<std::int64_t>(es), out, count, dtype);
      });
      CHECK(ag_in_place.first == ag_in_place.second);
      CHECK(ag_in_place.first == ag.first);
    }
  }
  // Integers: sum and max.
  const auto ints = make_input(DType::kInt64, r, 0, 257, 3);
  std::vector<std::byte> out(ints.size());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    auto ar = p.both(ints, out, [&](ProcessGroup& g, auto in, auto o) {
      g.all_reduce(in, o, 257, DType::kInt64, op);
    });
    CHECK(ar.first == ar.second);
  }
  // The same traffic counted (bytes as nccl-tests counts them, split by node).
  const CommCounts a = p.plain->stats().snapshot();
  const CommCounts b = p.staged->stats().snapshot();
  CHECK(a.bytes == b.bytes);
  CHECK(a.intra_bytes == b.intra_bytes);
  CHECK(a.inter_bytes == b.inter_bytes);
}

TEST_CASE("a staged group keeps the stream's order and splits", "[comm][staged]") {
  Pair p;
  const int n = p.staged->size();
  const int r = p.staged->rank();
  Stream& s = p.staged->stream();
  // The input is written on the stream just before the collective and read back just after:
  // the collective must see the first and the read must see its result, with no host wait.
  Buffer v = p.device->allocate(8, MemCategory::kOther, "value");
  const std::int64_t mine = 1000 + r;
  p.device->copy_to_device(v.device<std::byte>(), &mine, 8, s);
  p.staged->all_reduce(v.device<std::byte>(), v.device<std::byte>(), 1, DType::kInt64,
                       ReduceOp::kSum);
  std::int64_t got = 0;
  p.device->copy_to_host(&got, v.device<std::byte>(), 8, s);
  s.synchronize();
  CHECK(got == 1000 * n + n * (n - 1) / 2);

  // Even and odd ranks in two groups.
  std::unique_ptr<Stream> sub_stream = p.device->create_stream("sub");
  std::unique_ptr<ProcessGroup> sub = p.staged->split(r % 2, r, *sub_stream, "parity");
  REQUIRE(dynamic_cast<StagedProcessGroup*>(sub.get()) != nullptr);
  CHECK(sub->size() == (n + 1 - r % 2) / 2);
  p.device->copy_to_device(v.device<std::byte>(), &mine, 8, *sub_stream);
  sub->all_reduce(v.device<std::byte>(), v.device<std::byte>(), 1, DType::kInt64, ReduceOp::kMax);
  p.device->copy_to_host(&got, v.device<std::byte>(), 8, *sub_stream);
  sub_stream->synchronize();
  const int last_same_parity = (n - 1) - ((n - 1 - r % 2) % 2);
  CHECK(got == 1000 + last_same_parity);
  p.staged->barrier();
  s.synchronize();
}

}  // namespace
}  // namespace zrt
