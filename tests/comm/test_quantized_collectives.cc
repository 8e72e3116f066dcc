// The quantized collectives (runtime/comm/quantized_collectives.h) on the MPI backend at 4 and 8
// ranks, on simulated nodes (2 x 2, 4 x 1, 1 x 4; 2 x 4, 4 x 2): the all-gather within
// quantize.h's per-element bound, the hierarchical reduce-scatter within a bound derived step by
// step from the per-rank scales, against the exact sum (float64), and the bytes each group sends
// within and across nodes, exactly.
#include <catch2/catch.hpp>

#include <cmath>

#include "runtime/comm/quantize.h"
#include "runtime/comm/quantized_collectives.h"
#include "runtime/comm/topology.h"
#include "tests/comm/collective_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

constexpr double kU = 1.0 / (1 << 24);
const double kTiny = std::ldexp(1.0, -142);

double out_relative(DType dtype) {
  return dtype == DType::kBFloat16 ? 1.0 / 256 : (dtype == DType::kFloat16 ? 1.0 / 2048 : 0.0);
}

float input_at(DType dtype, int rank, std::int64_t index, int salt) {
  return element_as_float(make_input(dtype, rank, index, 1, salt).data(), dtype);
}

// fl(max |x| over [first, first + len) of rank r's input / 127): the scale the kernel computes.
float block_scale(DType dtype, int rank, std::int64_t first, std::int64_t len, int salt) {
  float a = 0.0f;
  for (std::int64_t i = first; i < first + len; ++i)
    a = std::max(a, std::fabs(input_at(dtype, rank, i, salt)));
  return a / 127.0f;
}

double quant_error(double scale) {
  return scale * (0.5 + 255 * kU) + kTiny;
}

struct Layout {
  int ranks_per_node;
};

struct Groups {
  CommFixture f;
  std::unique_ptr<ProcessGroup> intra, inter;
};

Groups make_groups(int ranks_per_node) {
  Groups g{make_comm({}, "world"), nullptr, nullptr};
  const NodeTopology topo(g.f.size(), ranks_per_node);
  g.f.group->set_node_map(topo.node_map());
  g.intra =
      make_subgroup(*g.f.group, intra_node_plan(topo.node_map(), g.f.rank()), *g.f.stream, "intra");
  g.inter =
      make_subgroup(*g.f.group, inter_node_plan(topo.node_map(), g.f.rank()), *g.f.stream, "inter");
  return g;
}

}  // namespace

TEST_CASE(
    "quantized all-gather: every slice within the per-element bound, int8 + scales on the "
    "wire") {
  auto g = make_groups(2);
  CommFixture& f = g.f;
  const int n = f.size();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (std::int64_t count : {std::int64_t{7}, std::int64_t{1000}}) {
      QuantizedCollectives qc(*f.device, *f.group, g.intra.get(), g.inter.get(), 256);
      const std::int64_t e = esize(dtype);
      Buffer in = upload(*f.device, *f.stream, make_input(dtype, f.rank(), 0, count, 9));
      Buffer out = upload(*f.device, *f.stream, {}, n * count * e);
      const CommCounts before = f.group->stats().snapshot();
      qc.all_gather(in.device<std::byte>(), out.device<std::byte>(), count, dtype);
      const auto got = download(*f.device, *f.stream, out.device<std::byte>(), n * count * e);
      const CommCounts c = f.group->stats().snapshot() - before;
      for (int r = 0; r < n; ++r) {
        for (std::int64_t i = 0; i < count; ++i) {
          const std::int64_t first = (i / 256) * 256;
          const float s =
              block_scale(dtype, r, first, std::min<std::int64_t>(256, count - first), 9);
          const double x = input_at(dtype, r, i, 9);
          const double y = element_as_float(got.data() + (r * count + i) * e, dtype);
          INFO("rank " << r << " element " << i);
          REQUIRE(std::fabs(x - y) <= quant_error(s) + 1.0 * out_relative(dtype) + 1e-30);
        }
      }
      // Bytes: codes padded to 4 + one fp32 scale per block, to each of 1 peer on the node and
      // n - 2 off it (2 ranks per node).
      const std::int64_t wire = 4 * ((count + 3) / 4) + 4 * ((count + 255) / 256);
      const auto ag = static_cast<std::size_t>(CollectiveOp::kAllGather);
      CHECK(c.calls[ag] == 1);
      CHECK(c.intra_bytes[ag] == wire);
      CHECK(c.inter_bytes[ag] == wire * (n - 2));
    }
  }
}

TEST_CASE(
    "hierarchical quantized reduce-scatter: within the derived bound of the exact sum, "
    "exact bytes per link") {
  const int n = [] {
    int s = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }();
  std::vector<int> layouts = {n / 2, 1, n};  // ranks per node: 2 nodes, n nodes of 1, one node
  if (n == 8) layouts.push_back(2);
  for (int L : layouts) {
    auto g = make_groups(L);
    CommFixture& f = g.f;
    const int M = n / L;
    const int me = f.rank();
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (std::int64_t count : {std::int64_t{7}, std::int64_t{1000}}) {
          INFO(M << " nodes x " << L << " ranks, " << dtype_name(dtype) << " " << reduce_op_name(op)
                 << " count " << count);
          const std::int64_t block = 256;
          QuantizedCollectives qc(*f.device, *f.group, g.intra.get(), g.inter.get(), block);
          const std::int64_t e = esize(dtype);
          const int salt = 17;
          Buffer in = upload(*f.device, *f.stream, make_input(dtype, me, 0, n * count, salt));
          Buffer out = upload(*f.device, *f.stream, {}, count * e);
          const CommCounts intra0 = g.intra->stats().snapshot();
          const CommCounts inter0 = g.inter->stats().snapshot();
          qc.reduce_scatter(in.device<std::byte>(), out.device<std::byte>(), count, dtype, op);
          const auto got = download(*f.device, *f.stream, out.device<std::byte>(), count * e);
          double worst = 0.0;
          double any_error = 0.0;
          for (std::int64_t i = 0; i < count; ++i) {
            const std::int64_t j = me * count + i;  // index into every rank's input
            const std::int64_t first = me * count + (i / block) * block;
            const std::int64_t len = std::min(block, count - (i / block) * block);
            double exact = 0.0, abs_sum = 0.0, e1 = 0.0, e2 = 0.0, partial_abs = 0.0;
            for (int m = 0; m < M; ++m) {
              double node_max = 0.0;  // bound on max |partial of node m| over the block
              for (int l = 0; l < L; ++l) {
                const int r = m * L + l;
                const double x = input_at(dtype, r, j, salt);
                exact += x;
                abs_sum += std::fabs(x);
                // Step 1 quantizes every contribution once (unless one rank per node).
                const float s = block_scale(dtype, r, first, len, salt);
                const double err = L > 1 ? quant_error(s) : 0.0;
                e1 += err;
                node_max += (s * 127.0 * (1 + kU) + err) * (1 + L * kU * 1.01);
              }
              partial_abs += node_max;
              // Step 2 quantizes each node's fp32 partial (unless one node).
              if (M > 1) e2 += quant_error(node_max / 127.0 * (1 + kU));
            }
            // fp32 sums: L - 1 additions per node, M - 1 across nodes, each rounding relatively.
            const double sums = ((L - 1) + (M - 1)) * kU * 1.01 * (partial_abs + e1 + e2);
            double bound = e1 + e2 + sums;
            double reference = exact;
            if (op == ReduceOp::kAvg) {
              reference /= n;
              bound = bound / n + kU * (std::fabs(reference) + bound);
            }
            bound += (std::fabs(reference) + bound) * out_relative(dtype) + 1e-30;
            const double y = element_as_float(got.data() + i * e, dtype);
            INFO("element " << i << " exact " << reference << " got " << y << " bound " << bound);
            REQUIRE(std::fabs(y - reference) <= bound);
            worst = std::max(worst, std::fabs(y - reference) / bound);
            any_error = std::max(any_error, std::fabs(y - reference));
            (void)abs_sum;
          }
          // The values really went through int8: not exact, and the bound is not loose by orders
          // of magnitude.
          CHECK(any_error > 0.0);
          if (count == 1000 && dtype == DType::kFloat32) CHECK(worst > 0.05);
          // Bytes: step 1 sends M slices to each of L - 1 local peers, step 2 one slice to each of
          // M - 1 other nodes, all as codes (padded to 4) + scales.
          const std::int64_t wire = 4 * ((count + 3) / 4) + 4 * ((count + block - 1) / block);
          const CommCounts intra = g.intra->stats().snapshot() - intra0;
          const CommCounts inter = g.inter->stats().snapshot() - inter0;
          CHECK(intra.total_intra_bytes() == (L > 1 ? (L - 1) * M * wire : 0));
          CHECK(intra.total_inter_bytes() == 0);
          CHECK(inter.total_inter_bytes() == (M > 1 ? (M - 1) * wire : 0));
          CHECK(inter.total_intra_bytes() == 0);
        }
      }
    }
  }
}

TEST_CASE("quantized collectives refuse mismatched groups and integer dtypes") {
  auto g = make_groups(2);
  CommFixture& f = g.f;
  CHECK_THROWS_WITH(QuantizedCollectives(*f.device, *f.group, g.intra.get(), nullptr),
                    Catch::Contains("give both the intra- and the inter-node group"));
  QuantizedCollectives qc(*f.device, *f.group, nullptr, nullptr);
  CHECK_THROWS_WITH(qc.reduce_scatter(DevicePtr<const std::byte>(), DevicePtr<std::byte>(), 4,
                                      DType::kInt32, ReduceOp::kSum),
                    Catch::Contains("not int32"));
  CHECK_THROWS_WITH(qc.reduce_scatter(DevicePtr<const std::byte>(), DevicePtr<std::byte>(), 4,
                                      DType::kFloat32, ReduceOp::kMax),
                    Catch::Contains("sums or averages, not max"));
}
