// ParallelLayout at 1, 2 and 4 ranks (nodes simulated with comm.ranks_per_node): the groups each
// configuration asks for, their sizes, members and node maps, the engine's table, and the
// traffic summed over the engine's groups.
#include <catch2/catch.hpp>

#include <mpi.h>

#include "runtime/comm/parallel_layout.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"

using namespace zrt;

namespace {

struct Fixture {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> comm = device->create_stream("comm");
  std::unique_ptr<Stream> control = device->create_stream("control");
  int world = 1;
  Fixture() { MPI_Comm_size(MPI_COMM_WORLD, &world); }
  ParallelDims dims(int stage) const {
    ParallelDims d;
    d.world = world;
    d.stage = stage;
    return d;
  }
};

}  // namespace

TEST_CASE("plain data parallelism: the world, the control group, nothing else") {
  Fixture f;
  for (int stage = 0; stage <= 3; ++stage) {
    ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, f.dims(stage), {});
    CHECK(layout.world_group().size() == f.world);
    CHECK(layout.control_group().size() == f.world);
    CHECK(&layout.world_group().stream() == f.comm.get());
    CHECK(&layout.control_group().stream() == f.control.get());
    CHECK(&layout.shard_group() == &layout.world_group());
    CHECK(layout.replica_group() == nullptr);
    CHECK(layout.quantized() == nullptr);
    CHECK(layout.hpz_group() == nullptr);
    const auto groups = layout.engine_groups();
    REQUIRE(groups.size() == 1);
    CHECK(groups[0].shard == &layout.world_group());
    CHECK(groups[0].replicas == nullptr);
    CHECK(layout.dims().shard_world() == (stage == 0 ? 1 : f.world));
    // One machine, detected as one node.
    CHECK(layout.dims().ranks_per_node == f.world);
  }
}

TEST_CASE("MiCS, qgZ and hpZ groups over simulated nodes") {
  Fixture f;
  if (f.world < 2) {
    WARN("sub-groups need 2 or more ranks");
    return;
  }
  const int per_node = f.world / 2;
  {
    ParallelDims d = f.dims(3);
    d.ranks_per_node = per_node;
    d.mics_shard_size = per_node;
    d.quantized_gradients = true;
    ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {});
    const int rank = layout.rank();
    REQUIRE(layout.topology().has_value());
    CHECK(layout.topology()->node_count() == 2);
    CHECK(layout.shard_group().size() == per_node);
    CHECK(layout.shard_group().rank() == rank % per_node);
    REQUIRE(layout.replica_group() != nullptr);
    CHECK(layout.replica_group()->size() == 2);
    CHECK(layout.replica_group()->rank() == rank / per_node);
    // The shard group is one node: the quantized collectives need no hierarchy.
    CHECK(layout.intra_node_group() == nullptr);
    CHECK(layout.quantized() != nullptr);
    const auto groups = layout.engine_groups();
    REQUIRE(groups.size() == 1);
    CHECK(groups[0].shard == &layout.shard_group());
    CHECK(groups[0].replicas == layout.replica_group());
    CHECK(groups[0].quantized == layout.quantized());
    CHECK(layout.dims().shard_world() == per_node);

    // The traffic of every engine group is counted, the control group's is not.
    const CommCounts before = layout.engine_traffic();
    std::vector<float> host(static_cast<std::size_t>(2 * f.world), 1.0f);
    Buffer buf = f.device->allocate(static_cast<std::int64_t>(host.size()) * 4,
                                    MemCategory::kWorkspace, "test");
    f.device->copy_to_device(buf.device<std::byte>(), host.data(), host.size() * 4, *f.comm);
    layout.replica_group()->all_reduce(buf.device<std::byte>(), buf.device<std::byte>(),
                                       static_cast<std::int64_t>(host.size()), DType::kFloat32,
                                       ReduceOp::kSum);
    layout.control_group().all_reduce(buf.device<std::byte>(), buf.device<std::byte>(), 1,
                                      DType::kFloat32, ReduceOp::kSum);
    f.comm->synchronize();
    f.control->synchronize();
    const CommCounts sent = layout.engine_traffic() - before;
    CHECK(sent.total_bytes() > 0);
    CHECK(sent.total_bytes() == layout.replica_group()->stats().snapshot().total_bytes());
  }
  {
    // qgZ over the world of two nodes: intra- and inter-node groups.
    ParallelDims d = f.dims(2);
    d.ranks_per_node = per_node;
    d.quantized_gradients = true;
    ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {});
    REQUIRE(layout.intra_node_group() != nullptr);
    CHECK(layout.intra_node_group()->size() == per_node);
    REQUIRE(layout.inter_node_group() != nullptr);
    CHECK(layout.inter_node_group()->size() == 2);
  }
  {
    ParallelDims d = f.dims(3);
    d.ranks_per_node = per_node;
    d.hpz_partition_size = per_node;
    if (per_node > 1) {
      ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {});
      REQUIRE(layout.hpz_group() != nullptr);
      CHECK(layout.hpz_group()->size() == per_node);
      CHECK(layout.engine_groups()[0].secondary == layout.hpz_group());
      CHECK(layout.hpz_group()->node_map() == std::vector<int>(per_node, layout.rank() / per_node));
    }
  }
}

// Sequence and expert parallelism together: the sp group is the rank's block of 2, the expert-
// parallel group 2 ranks at its sp position, and the expert-data-parallel group every rank of the
// sp blocks holding its experts (world / ep), whose chunks route tokens to the same experts.
TEST_CASE("the layout builds sequence and expert parallelism together") {
  Fixture f;
  if (f.world < 4) return;
  std::unique_ptr<Stream> sequence = f.device->create_stream("sequence");
  ParallelDims both = f.dims(1);
  both.expert_parallel_size = 2;
  both.sequence_parallel_size = 2;
  ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, both, {}, sequence.get());
  REQUIRE(layout.sequence_group() != nullptr);
  REQUIRE(layout.expert_parallel_group() != nullptr);
  REQUIRE(layout.expert_data_parallel_group() != nullptr);
  CHECK(layout.sequence_group()->size() == 2);
  CHECK(layout.expert_parallel_group()->size() == 2);
  CHECK(layout.expert_data_parallel_group()->size() == f.world / 2);
}

TEST_CASE("the layout refuses inconsistent degrees with every problem, before any sub-group") {
  Fixture f;
  ParallelDims d = f.dims(0);
  d.mics_shard_size = f.world;
  d.quantized_weights = true;
  CHECK_THROWS_WITH(
      ParallelLayout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {}),
      Catch::Contains("mics_shard_size: hierarchical sharding needs stage 1, 2 or 3") &&
          Catch::Contains("zero_quantized_weights: qwZ quantizes stage 3's"));
  ParallelDims wrong = f.dims(1);
  wrong.world = f.world + 1;
  CHECK_THROWS_WITH(ParallelLayout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, wrong, {}),
                    Catch::Contains("the parallel layout is for"));
}

TEST_CASE("expert parallelism: the expert-parallel and expert-data-parallel groups, group 1") {
  Fixture f;
  for (int ep = 2; ep <= f.world; ep *= 2) {
    if (f.world % ep != 0) continue;
    for (bool data_before : {false, true}) {
      ParallelDims d = f.dims(2);
      d.expert_parallel_size = ep;
      d.data_before_expert_parallel = data_before;
      ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {});
      const int rank = layout.rank(), edp = f.world / ep;
      INFO("world " << f.world << ", ep " << ep << (data_before ? ", data before expert" : ""));
      ProcessGroup* experts = layout.expert_parallel_group();
      ProcessGroup* replicas = layout.expert_data_parallel_group();
      REQUIRE(experts != nullptr);
      REQUIRE(replicas != nullptr);
      CHECK(experts->size() == ep);
      CHECK(replicas->size() == edp);
      CHECK(&experts->stream() == f.comm.get());
      // E + D (DeepSpeed's default): ep groups of consecutive ranks; D + E: strided.
      CHECK(experts->rank() == (data_before ? rank / edp : rank % ep));
      CHECK(replicas->rank() == (data_before ? rank % edp : rank / ep));
      const std::vector<ShardGroup> groups = layout.engine_groups();
      REQUIRE(groups.size() == 2);
      CHECK(groups[1].shard == replicas);
      CHECK(groups[1].norm_peers == experts);
      CHECK(groups[1].replicas == nullptr);
      CHECK(groups[1].gradient_scale == 1.0f / static_cast<float>(ep));
    }
  }
  // ZeRO++ over the experts too: quantized collectives over the expert-data-parallel group,
  // hierarchical where it spans the simulated nodes (2 ranks a node).
  if (f.world >= 4) {
    ParallelDims d = f.dims(3);
    d.expert_parallel_size = 2;
    d.ranks_per_node = 2;
    d.quantized_weights = d.quantized_gradients = true;
    ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {});
    const std::vector<ShardGroup> groups = layout.engine_groups();
    REQUIRE(groups.size() == 2);
    CHECK(groups[0].quantized == layout.quantized());
    REQUIRE(layout.expert_quantized() != nullptr);
    CHECK(groups[1].quantized == layout.expert_quantized());
    CHECK(groups[1].quantized != groups[0].quantized);
    CHECK(groups[1].secondary == nullptr);
    // E + D: ep groups {0,1}, {2,3}, ...; each expert-data-parallel group takes one rank of
    // every node.
    CHECK(layout.expert_data_parallel_group()->node_map().size() ==
          static_cast<std::size_t>(f.world / 2));
  }
  // hpZ over the experts too: their secondary shards over their expert-data-parallel ranks in
  // this rank's hpZ block (a node of 2: one of them at ep 2).
  if (f.world >= 4) {
    ParallelDims d = f.dims(3);
    d.expert_parallel_size = 2;
    d.ranks_per_node = 2;
    d.hpz_partition_size = 2;
    ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {});
    const std::vector<ShardGroup> groups = layout.engine_groups();
    REQUIRE(groups.size() == 2);
    CHECK(groups[0].secondary == layout.hpz_group());
    REQUIRE(layout.expert_hpz_group() != nullptr);
    CHECK(groups[1].secondary == layout.expert_hpz_group());
    CHECK(layout.expert_hpz_group()->size() == 1);
  }
  // MiCS over the experts too: their state over their expert-data-parallel ranks in this rank's
  // shard group (a node of 2: one of them at ep 2, E + D; both at D + E), replicated over the
  // others; ZeRO++'s collectives over that group.
  if (f.world >= 4) {
    for (bool data_before : {false, true}) {
      ParallelDims d = f.dims(3);
      d.expert_parallel_size = 2;
      d.ranks_per_node = 2;
      d.mics_shard_size = 2;
      d.quantized_gradients = true;
      d.data_before_expert_parallel = data_before;
      ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {});
      const std::vector<ShardGroup> groups = layout.engine_groups();
      REQUIRE(groups.size() == 2);
      CHECK(groups[0].shard == &layout.shard_group());
      CHECK(groups[0].shard->size() == 2);
      CHECK(groups[1].shard == &layout.expert_shard_group());
      CHECK(groups[1].shard != layout.expert_data_parallel_group());
      CHECK(groups[1].replicas == layout.expert_replica_group());
      const int shard = data_before ? 2 : 1;
      CHECK(groups[1].shard->size() == shard);
      CHECK(groups[1].replicas->size() == f.world / 2 / shard);
      CHECK(groups[1].shard->size() * groups[1].replicas->size() ==
            layout.expert_data_parallel_group()->size());
      CHECK(groups[1].norm_peers == layout.expert_parallel_group());
      REQUIRE(layout.expert_quantized() != nullptr);
      CHECK(groups[1].quantized == layout.expert_quantized());
    }
  }
  // ep 1: no expert group, the engine's table as without it.
  ParallelLayout plain(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, f.dims(2), {});
  CHECK(plain.expert_parallel_group() == nullptr);
  CHECK(plain.engine_groups().size() == 1);
}

TEST_CASE("sequence parallelism: blocks of sp consecutive ranks on their own stream") {
  Fixture f;
  std::unique_ptr<Stream> sequence = f.device->create_stream("sequence");
  for (int sp = 2; sp <= f.world; sp *= 2) {
    for (int stage = 0; stage <= 3; ++stage) {
      ParallelDims d = f.dims(stage);
      d.sequence_parallel_size = sp;
      INFO("sp " << sp << " stage " << stage);
      ParallelLayout layout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {}, sequence.get());
      ProcessGroup* g = layout.sequence_group();
      REQUIRE(g != nullptr);
      CHECK(g->size() == sp);
      CHECK(g->rank() == layout.rank() % sp);
      CHECK(&g->stream() == sequence.get());
      // ZeRO shards and reduces over the whole world, the sp blocks included.
      CHECK(&layout.shard_group() == &layout.world_group());
      CHECK(layout.dims().shard_world() == (stage == 0 ? 1 : f.world));
      CHECK(layout.dims().data_parallel_size() == f.world / sp);
      CHECK(layout.sequence_traffic().total_bytes() == 0);
    }
    ParallelDims d = f.dims(1);
    d.sequence_parallel_size = sp;
    CHECK_THROWS_WITH(ParallelLayout(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, d, {}),
                      Catch::Contains("without a stream for its all-to-alls"));
  }
  ParallelLayout plain(*f.device, MPI_COMM_WORLD, *f.comm, *f.control, f.dims(1), {});
  CHECK(plain.sequence_group() == nullptr);
}
