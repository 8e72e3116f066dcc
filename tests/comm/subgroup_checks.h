// Checks shared by the MPI and NCCL sub-group tests: every collective on the node, shard and
// replica sub-groups against a serial reference over the members' inputs (bit for bit: sums in
// fp32 in member order, as the backends promise), and the intra-/inter-node byte counters
// against counts derived from the topology.
#pragma once

#include <string>
#include <vector>

#include "runtime/comm/topology.h"
#include "tests/comm/collective_test_util.h"

namespace zrt::test {

// fp32 sum in member order of element `index` of each member's input, rounded to dtype.
inline float member_sum(DType dtype, const std::vector<int>& members, std::int64_t index,
                        int salt) {
  float acc = 0.0f;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto one = make_input(dtype, members[i], index, 1, salt);
    const float v = element_as_float(one.data(), dtype);
    acc = i == 0 ? v : acc + v;
  }
  std::byte out[4];
  store_float(out, dtype, acc);
  return element_as_float(out, dtype);
}

// Every collective on `sub` (whose members, in sub-group rank order, are the world ranks
// `members`; this process is world rank `me`), checked bit for bit.
template <typename Fixture>
void check_member_collectives(Fixture& f, ProcessGroup& sub, const std::vector<int>& members,
                              int me) {
  const int m = static_cast<int>(members.size());
  REQUIRE(sub.size() == m);
  REQUIRE(members[static_cast<std::size_t>(sub.rank())] == me);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}}) {
      INFO("group " << sub.name() << " dtype " << dtype_name(dtype) << " count " << count);
      const std::int64_t e = esize(dtype);
      // all_gather
      Buffer in = upload(*f.device, *f.stream, make_input(dtype, me, 0, m * count, 3));
      Buffer out = upload(*f.device, *f.stream, {}, m * count * e);
      sub.all_gather(in.device<std::byte>(), out.device<std::byte>(), count, dtype);
      auto got = download(*f.device, *f.stream, out.device<std::byte>(), m * count * e);
      for (int p = 0; p < m; ++p) {
        const auto expect = make_input(dtype, members[p], 0, count, 3);
        REQUIRE(std::memcmp(got.data() + p * count * e, expect.data(), expect.size()) == 0);
      }
      // all_to_all: block p of the output is block `sub.rank()` of member p's input.
      sub.all_to_all(in.device<std::byte>(), out.device<std::byte>(), count, dtype);
      got = download(*f.device, *f.stream, out.device<std::byte>(), m * count * e);
      for (int p = 0; p < m; ++p) {
        const auto expect = make_input(dtype, members[p], sub.rank() * count, count, 3);
        REQUIRE(std::memcmp(got.data() + p * count * e, expect.data(), expect.size()) == 0);
      }
      // reduce_scatter (sum)
      sub.reduce_scatter(in.device<std::byte>(), out.device<std::byte>(), count, dtype,
                         ReduceOp::kSum);
      got = download(*f.device, *f.stream, out.device<std::byte>(), count * e);
      for (std::int64_t i = 0; i < count; ++i) {
        const float expect = member_sum(dtype, members, sub.rank() * count + i, 3);
        REQUIRE(float_bits(element_as_float(got.data() + i * e, dtype)) == float_bits(expect));
      }
      // all_reduce (sum), in place
      sub.all_reduce(in.device<std::byte>(), in.device<std::byte>(), count, dtype, ReduceOp::kSum);
      got = download(*f.device, *f.stream, in.device<std::byte>(), count * e);
      for (std::int64_t i = 0; i < count; ++i) {
        REQUIRE(float_bits(element_as_float(got.data() + i * e, dtype)) ==
                float_bits(member_sum(dtype, members, i, 3)));
      }
      // broadcast from the last member
      Buffer b = upload(*f.device, *f.stream, make_input(dtype, me, 0, count, 5));
      sub.broadcast(b.device<std::byte>(), count, dtype, m - 1);
      REQUIRE(download(*f.device, *f.stream, b.device<std::byte>(), count * e) ==
              make_input(dtype, members.back(), 0, count, 5));
    }
  }
}

// Members of `members` on the same node as world rank `me`, other than `me`, and the others.
inline LinkBytes expected_split(const NodeTopology& topo, const std::vector<int>& members, int me,
                                std::int64_t bytes_per_peer) {
  LinkBytes b;
  for (int r : members) {
    if (r == me) continue;
    (topo.same_node(r, me) ? b.intra : b.inter) += bytes_per_peer;
  }
  return b;
}

// One fp32 all-gather and one fp32 all-reduce of 1000 elements on `sub`; the counters must
// show the bytes this rank sends to its node and to other nodes.
template <typename Fixture>
void check_link_counters(Fixture& f, ProcessGroup& sub, const NodeTopology& topo,
                         const std::vector<int>& members, int me) {
  const int m = static_cast<int>(members.size());
  Buffer a = upload(*f.device, *f.stream, {}, 1000 * m * 4);
  Buffer b = upload(*f.device, *f.stream, {}, 1000 * m * 4);
  f.device->fill_zero(a.device<std::byte>(), 1000 * m * 4, *f.stream);
  const CommCounts before = sub.stats().snapshot();
  sub.all_gather(a.device<std::byte>(), b.device<std::byte>(), 1000, DType::kFloat32);
  sub.all_reduce(a.device<std::byte>(), a.device<std::byte>(), 1000, DType::kFloat32,
                 ReduceOp::kSum);
  f.stream->synchronize();
  const CommCounts c = sub.stats().snapshot() - before;
  const auto ag = static_cast<std::size_t>(CollectiveOp::kAllGather);
  const auto ar = static_cast<std::size_t>(CollectiveOp::kAllReduce);
  const LinkBytes expect_ag = expected_split(topo, members, me, 4000);
  // The all-reduce sends its padded slice (ceil(1000 / m) elements) to every peer twice.
  const LinkBytes expect_ar = expected_split(topo, members, me, 2 * 4 * ((1000 + m - 1) / m));
  INFO("group " << sub.name());
  CHECK(c.intra_bytes[ag] == expect_ag.intra);
  CHECK(c.inter_bytes[ag] == expect_ag.inter);
  CHECK(c.intra_bytes[ar] == expect_ar.intra);
  CHECK(c.inter_bytes[ar] == expect_ar.inter);
  CHECK(c.total_intra_bytes() + c.total_inter_bytes() ==
        (m - 1) * (4000 + 8 * ((1000 + m - 1) / m)));
}

// Node, shard and replica sub-groups of f.group (the world) with `ranks_per_node` ranks per
// simulated node and MiCS shards of `shard_size`.
template <typename Fixture>
void check_subgroups(Fixture& f, int ranks_per_node, int shard_size) {
  const int me = f.rank();
  const NodeTopology topo(f.size(), ranks_per_node);
  f.group->set_node_map(topo.node_map());
  std::vector<int> world;
  for (int r = 0; r < f.size(); ++r) world.push_back(r);
  check_link_counters(f, *f.group, topo, world, me);
  const std::vector<std::pair<std::string, SubgroupPlan>> plans = {
      {"intra-node", intra_node_plan(topo.node_map(), me)},
      {"inter-node", inter_node_plan(topo.node_map(), me)},
      {"shard", shard_plan(f.size(), shard_size, me)},
      {"replica", replica_plan(f.size(), shard_size, me)},
  };
  for (const auto& [name, plan] : plans) {
    auto sub = make_subgroup(*f.group, plan, *f.stream, name);
    check_member_collectives(f, *sub, plan.members, me);
    check_link_counters(f, *sub, topo, plan.members, me);
  }
}

}  // namespace zrt::test
