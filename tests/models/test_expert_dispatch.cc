// ExpertDispatch (models/moe/expert_dispatch.h) at 2 and 4 ranks, autoep_size 2 and 4: a layer of
// linear experts y = x W_e^T over routed rows, its forward and backward through the expert-parallel
// exchange, against a single-process computation of the same layer over every rank's rows.
// Outputs and input gradients equal the reference bit for bit (each row's dot products run in the
// same order); the experts' weight gradients, averaged over the expert-data-parallel group and
// multiplied by 1 / ep (ShardGroup::gradient_scale), equal the data-parallel average of the
// single-process gradients within fp32 rounding, and would be ep times too large without the
// factor. Routings: random (empty experts included) and every row of every rank to one expert.
// comm.check_collective_sequence is on throughout, and a rank that skips the exchange (a layer
// that returns early when it has no row) is named by the check instead of hanging.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "models/moe/expert_dispatch.h"
#include "runtime/comm/parallel_dims.h"
#include "runtime/comm/topology.h"
#include "runtime/device/device_access.h"
#include "tests/comm/collective_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

constexpr int kWidth = 8;    // C: a row's width (and the experts' output width)
constexpr int kExperts = 4;  // E
constexpr double kTimeoutS = 60.0;

// Rows rank r routes to expert e: known to every rank.
using Routing = std::function<std::int64_t(int rank, int expert)>;

std::int64_t random_routing(int rank, int expert) {
  if ((rank + expert) % 3 == 1) return 0;  // empty experts, differently on every rank
  return static_cast<std::int64_t>((input_value(rank, expert, 3) + 1.0f) * 2.5f);
}

std::int64_t all_to_last_expert(int rank, int expert) {
  return expert == kExperts - 1 ? 5 + rank : 0;
}

float weight(int expert, int out, int in) {
  return input_value(1000 + expert, out * kWidth + in, 7) * 0.5f;
}

// Row i of rank r's rows (input x when salt 11, output gradient dy when salt 13).
std::vector<float> row(int rank, std::int64_t i, int salt) {
  std::vector<float> v(kWidth);
  for (int c = 0; c < kWidth; ++c)
    v[static_cast<std::size_t>(c)] = input_value(rank, i * kWidth + c, salt);
  return v;
}

// y = x W_e^T and dx = dy W_e, each output element one dot product in a fixed order.
void expert_forward(int e, const float* x, float* y) {
  for (int o = 0; o < kWidth; ++o) {
    float acc = 0.0f;
    for (int c = 0; c < kWidth; ++c) acc += x[c] * weight(e, o, c);
    y[o] = acc;
  }
}
void expert_input_grad(int e, const float* dy, float* dx) {
  for (int c = 0; c < kWidth; ++c) {
    float acc = 0.0f;
    for (int o = 0; o < kWidth; ++o) acc += dy[o] * weight(e, o, c);
    dx[c] = acc;
  }
}

// The expert of each of rank r's rows (in global expert order).
std::vector<int> experts_of_rows(const Routing& routing, int rank) {
  std::vector<int> out;
  for (int e = 0; e < kExperts; ++e) {
    for (std::int64_t i = 0; i < routing(rank, e); ++i) out.push_back(e);
  }
  return out;
}

struct Ranks {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> compute = device->create_stream("compute");
  std::unique_ptr<Stream> comm = device->create_stream("comm");
  std::unique_ptr<ProcessGroup> world, ep, edp;
  explicit Ranks(int ep_size) {
    CommOptions options;
    options.check_collective_sequence = true;
    options.timeout_s = kTimeoutS;
    world = make_process_group(*device, MPI_COMM_WORLD, *comm, "world", options);
    ParallelDims dims;
    dims.world = world->size();
    dims.stage = 2;
    dims.expert_parallel_size = ep_size;
    ep = make_subgroup(*world, dims.expert_parallel_plan(world->rank()), *comm, "expert-parallel");
    edp = make_subgroup(*world, dims.expert_data_parallel_plan(world->rank()), *comm,
                        "expert-data-parallel");
  }
};

Buffer upload_floats(Device& device, Stream& stream, const std::vector<float>& values) {
  std::vector<std::byte> bytes(std::max<std::size_t>(values.size(), 1) * 4);
  std::memcpy(bytes.data(), values.data(), values.size() * 4);
  return upload(device, stream, bytes);
}

float* host_floats(Buffer& b) {
  return reinterpret_cast<float*>(device_access::raw(b.device<std::byte>()));
}

// One forward and backward of the layer on this rank through the exchange; checks the outputs and
// input gradients against the reference and the scaled, reduced weight gradients against the
// data-parallel average of the reference's.
void check_layer(int ep_size, const Routing& routing) {
  Ranks r(ep_size);
  const int rank = r.world->rank(), world = r.world->size();
  moe::ExpertDispatch dispatch(*r.device, *r.compute, *r.ep, kExperts);
  const moe::ExpertPartition& part = dispatch.experts();
  std::vector<std::int64_t> counts(kExperts);
  for (int e = 0; e < kExperts; ++e) counts[static_cast<std::size_t>(e)] = routing(rank, e);
  const moe::DispatchPlan plan = dispatch.plan(counts);

  const std::vector<int> mine = experts_of_rows(routing, rank);
  std::vector<float> x, dy;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const auto a = row(rank, static_cast<std::int64_t>(i), 11);
    const auto b = row(rank, static_cast<std::int64_t>(i), 13);
    x.insert(x.end(), a.begin(), a.end());
    dy.insert(dy.end(), b.begin(), b.end());
  }
  REQUIRE(static_cast<std::int64_t>(mine.size()) == plan.rows);
  Buffer x_rows = upload_floats(*r.device, *r.compute, x);
  Buffer dy_rows = upload_floats(*r.device, *r.compute, dy);
  const auto local_bytes = std::max<std::int64_t>(plan.local_rows * kWidth * 4, 4);
  const auto row_bytes = std::max<std::int64_t>(plan.rows * kWidth * 4, 4);
  Buffer x_local = r.device->allocate(local_bytes, MemCategory::kOther, "x local");
  Buffer y_local = r.device->allocate(local_bytes, MemCategory::kOther, "y local");
  Buffer dy_local = r.device->allocate(local_bytes, MemCategory::kOther, "dy local");
  Buffer dx_local = r.device->allocate(local_bytes, MemCategory::kOther, "dx local");
  Buffer y_rows = r.device->allocate(row_bytes, MemCategory::kOther, "y");
  Buffer dx_rows = r.device->allocate(row_bytes, MemCategory::kOther, "dx");

  // Forward: rows to the experts, the local experts, outputs back.
  dispatch.dispatch(plan, x_rows.device<std::byte>(), x_local.device<std::byte>(), kWidth,
                    DType::kFloat32);
  r.compute->synchronize();
  std::vector<float> dw(static_cast<std::size_t>(part.local() * kWidth * kWidth), 0.0f);
  {
    std::int64_t at = 0;
    for (int l = 0; l < part.local(); ++l) {
      for (std::int64_t i = 0; i < plan.local_counts[static_cast<std::size_t>(l)]; ++i, ++at) {
        expert_forward(part.first_local() + l, host_floats(x_local) + at * kWidth,
                       host_floats(y_local) + at * kWidth);
      }
    }
  }
  dispatch.combine(plan, y_local.device<std::byte>(), y_rows.device<std::byte>(), kWidth,
                   DType::kFloat32);
  // Backward: output gradients to the experts, input and weight gradients there, dx back.
  dispatch.dispatch(plan, dy_rows.device<std::byte>(), dy_local.device<std::byte>(), kWidth,
                    DType::kFloat32);
  r.compute->synchronize();
  {
    std::int64_t at = 0;
    for (int l = 0; l < part.local(); ++l) {
      for (std::int64_t i = 0; i < plan.local_counts[static_cast<std::size_t>(l)]; ++i, ++at) {
        const float* xr = host_floats(x_local) + at * kWidth;
        const float* g = host_floats(dy_local) + at * kWidth;
        expert_input_grad(part.first_local() + l, g, host_floats(dx_local) + at * kWidth);
        for (int o = 0; o < kWidth; ++o) {
          for (int c = 0; c < kWidth; ++c) {
            dw[static_cast<std::size_t>((l * kWidth + o) * kWidth + c)] += g[o] * xr[c];
          }
        }
      }
    }
  }
  dispatch.combine(plan, dx_local.device<std::byte>(), dx_rows.device<std::byte>(), kWidth,
                   DType::kFloat32);
  r.compute->synchronize();

  // Outputs and input gradients: the reference's, bit for bit.
  for (std::size_t i = 0; i < mine.size(); ++i) {
    float y[kWidth], dx[kWidth];
    expert_forward(mine[i], x.data() + i * kWidth, y);
    expert_input_grad(mine[i], dy.data() + i * kWidth, dx);
    for (int c = 0; c < kWidth; ++c) {
      INFO("rank " << rank << " row " << i << " (expert " << mine[i] << ") element " << c);
      REQUIRE(host_floats(y_rows)[i * kWidth + static_cast<std::size_t>(c)] == y[c]);
      REQUIRE(host_floats(dx_rows)[i * kWidth + static_cast<std::size_t>(c)] == dx[c]);
    }
  }

  // Weight gradients as the engine reduces an expert unit: averaged over the expert-data-parallel
  // group, times 1 / ep. Reference: the data-parallel average over every rank's rows.
  Buffer reduced = upload_floats(*r.device, *r.comm, dw);
  r.edp->all_reduce(reduced.device<std::byte>(), reduced.device<std::byte>(),
                    static_cast<std::int64_t>(dw.size()), DType::kFloat32, ReduceOp::kAvg);
  r.comm->synchronize();
  for (int l = 0; l < part.local(); ++l) {
    const int e = part.first_local() + l;
    std::vector<double> expect(kWidth * kWidth, 0.0);
    for (int s = 0; s < world; ++s) {
      const std::vector<int> theirs = experts_of_rows(routing, s);
      for (std::size_t i = 0; i < theirs.size(); ++i) {
        if (theirs[i] != e) continue;
        const auto xs = row(s, static_cast<std::int64_t>(i), 11);
        const auto gs = row(s, static_cast<std::int64_t>(i), 13);
        for (int o = 0; o < kWidth; ++o) {
          for (int c = 0; c < kWidth; ++c) {
            expect[static_cast<std::size_t>(o * kWidth + c)] +=
                static_cast<double>(gs[static_cast<std::size_t>(o)]) *
                xs[static_cast<std::size_t>(c)] / world;
          }
        }
      }
    }
    for (int k = 0; k < kWidth * kWidth; ++k) {
      const double got =
          host_floats(reduced)[l * kWidth * kWidth + k] * (1.0f / static_cast<float>(ep_size));
      const double unscaled = host_floats(reduced)[l * kWidth * kWidth + k];
      INFO("expert " << e << " weight gradient element " << k);
      CHECK(got == Approx(expect[static_cast<std::size_t>(k)]).margin(1e-6).epsilon(1e-5));
      // The edp average alone counts each rank's rows ep times over.
      CHECK(unscaled ==
            Approx(ep_size * expect[static_cast<std::size_t>(k)]).margin(1e-6).epsilon(1e-5));
    }
  }
  // Every collective of the layer was agreed on by every rank: 3 on the expert-parallel group
  // (the count exchange, dispatch, combine) per plan and pass, whatever the routing.
  CHECK(r.ep->sequence_check()->verified() == 5);
}

}  // namespace

TEST_CASE("expert dispatch: random routing equals the single-process layer") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int ep : {2, 4}) {
    if (world % ep != 0) continue;
    INFO("world " << world << ", autoep_size " << ep);
    check_layer(ep, random_routing);
  }
}

TEST_CASE("expert dispatch: every row to one expert finishes with the right gradients") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int ep : {2, 4}) {
    if (world % ep != 0) continue;
    INFO("world " << world << ", autoep_size " << ep);
    check_layer(ep, all_to_last_expert);
  }
}

TEST_CASE("expert dispatch: a rank that skips the exchange is named, not waited for") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2) return;
  Ranks r(world);
  moe::ExpertDispatch dispatch(*r.device, *r.compute, *r.ep, kExperts);
  const moe::DispatchPlan plan = dispatch.plan(std::vector<std::int64_t>(kExperts, 0));
  Buffer rows = r.device->allocate(4, MemCategory::kOther, "rows");
  Buffer local = r.device->allocate(4, MemCategory::kOther, "local");
  try {
    // The last rank has no row for anyone and skips the exchange (the hang of DeepSpeed#4808);
    // it goes on to the next collective of the group.
    if (r.ep->rank() != r.ep->size() - 1) {
      dispatch.dispatch(plan, rows.device<std::byte>(), local.device<std::byte>(), kWidth,
                        DType::kFloat32);
    }
    r.ep->barrier();
    r.comm->synchronize();
    FAIL("the skipped exchange was not caught");
  } catch (const Timeout& e) {
    FAIL("a timeout instead of the sequence check's error: " << e.what());
  } catch (const Error& e) {
    const std::string text = e.what();
    INFO(text);
    CHECK(text.find("group 'expert-parallel'") != std::string::npos);
    CHECK(text.find("all_to_allv of fp32") != std::string::npos);
    CHECK(text.find(fmt::format("rank {}: barrier", r.ep->size() - 1)) != std::string::npos);
  }
}
