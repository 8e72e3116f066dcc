// What the MoE kernel tests share (test_moe_kernels, test_moe_block_golden,
// test_cuda_moe_kernels): float64 references of the router, the dispatch plan, combine and the
// grouped linear written from their definitions (kernels/moe_ops.h), and a backend with named
// device buffers for running kernels/moe_ops.h on a CPU or a CUDA context.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernel_context.h"
#include "kernels/moe_ops.h"
#include "runtime/device/device.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::test {

using Vec = std::vector<double>;
using Ids = std::vector<std::int32_t>;

// The router's definition: softmax, then the experts sorted by (probability descending, index
// ascending) and the first k; weights renormalised or not.
struct RouterRef {
  Vec probs, weights;
  Ids experts;
};
inline RouterRef router_reference(const Vec& logits, int N, int E, int k, bool renormalize) {
  RouterRef r{Vec(static_cast<std::size_t>(N) * E), Vec(static_cast<std::size_t>(N) * k),
              Ids(static_cast<std::size_t>(N) * k)};
  for (int n = 0; n < N; ++n) {
    const double* l = &logits[static_cast<std::size_t>(n) * E];
    const double m = *std::max_element(l, l + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - m);
    double* p = &r.probs[static_cast<std::size_t>(n) * E];
    for (int e = 0; e < E; ++e) p[e] = std::exp(l[e] - m) / sum;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double top = 0;
    for (int j = 0; j < k; ++j) top += p[order[j]];
    for (int j = 0; j < k; ++j) {
      r.experts[static_cast<std::size_t>(n) * k + j] = order[j];
      r.weights[static_cast<std::size_t>(n) * k + j] = p[order[j]] / (renormalize ? top : 1.0);
    }
  }
  return r;
}

// The dispatch plan by its definition: pairs in order, each expert's in a list.
struct PlanRef {
  Ids counts, offsets, row_of, source;
};
inline PlanRef plan_reference(const Ids& experts, int N, int k, int E) {
  PlanRef p{Ids(E, 0), Ids(E + 1, 0), Ids(static_cast<std::size_t>(N) * k, -1), {}};
  std::vector<Ids> lists(E);
  for (int q = 0; q < N * k; ++q) {
    if (experts[q] >= 0) lists[experts[q]].push_back(q);
  }
  for (int e = 0; e < E; ++e) {
    p.counts[e] = static_cast<std::int32_t>(lists[e].size());
    p.offsets[e + 1] = p.offsets[e] + p.counts[e];
    for (std::int32_t q : lists[e]) {
      p.row_of[q] = static_cast<std::int32_t>(p.source.size());
      p.source.push_back(q);
    }
  }
  return p;
}

// out (R,OC) rows of expert e = inp rows @ weight[e]^T, weight (E,OC,IC).
inline Vec grouped_linear_reference(const Vec& inp, const Vec& weight, const Ids& offsets, int E,
                                    int IC, int OC) {
  Vec out(static_cast<std::size_t>(offsets[E]) * OC, 0.0);
  for (int e = 0; e < E; ++e) {
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int o = 0; o < OC; ++o) {
        double s = 0;
        for (int i = 0; i < IC; ++i) {
          s += inp[static_cast<std::size_t>(r) * IC + i] *
               weight[(static_cast<std::size_t>(e) * OC + o) * IC + i];
        }
        out[static_cast<std::size_t>(r) * OC + o] = s;
      }
    }
  }
  return out;
}

// One backend: device, stream, kernel context and named buffers (floating of a dtype, or int32).
struct MoeBackend {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<kernels::KernelContext> ctx;
  std::map<std::string, std::pair<Buffer, DType>> buffers;
  std::map<std::string, Buffer> ints;

  explicit MoeBackend(DeviceType type, int index = 0, kernels::KernelOptions options = {}) {
    DeviceOptions device_options;
    device_options.type = type;
    device_options.index = index;
    device = make_device(device_options);
    stream = device->create_stream("compute");
    ctx = std::make_unique<kernels::KernelContext>(*device, *stream, options);
  }
  ~MoeBackend() { stream->synchronize(); }
  MoeBackend(const MoeBackend&) = delete;
  MoeBackend& operator=(const MoeBackend&) = delete;

  kernels::Bytes put(const std::string& name, const Vec& v, DType dt) {
    const auto bytes = encode(v, dt);
    Buffer b =
        device->allocate(static_cast<std::int64_t>(bytes.size() + 64), MemCategory::kOther, name);
    if (!bytes.empty()) {
      device->copy_to_device(b.device<std::byte>(), bytes.data(), bytes.size(), *stream);
    }
    stream->synchronize();
    const kernels::Bytes p = b.device<std::byte>();
    buffers[name] = {std::move(b), dt};
    return p;
  }
  kernels::Floats put_f32(const std::string& name, const Vec& v) {
    return put(name, v, DType::kFloat32).as<float>();
  }
  kernels::Ints put_ids(const std::string& name, const Ids& v) {
    const std::size_t bytes = v.size() * sizeof(std::int32_t);
    Buffer b = device->allocate(static_cast<std::int64_t>(bytes + 64), MemCategory::kOther, name);
    if (bytes > 0) device->copy_to_device(b.device<std::byte>(), v.data(), bytes, *stream);
    stream->synchronize();
    const kernels::Ints p = b.device<std::int32_t>();
    ints[name] = std::move(b);
    return p;
  }
  Vec get(const std::string& name, std::size_t n) {
    const auto& [b, dt] = buffers.at(name);
    std::vector<std::byte> bytes(n * dtype_size(dt));
    if (n > 0) device->copy_to_host(bytes.data(), b.device<std::byte>(), bytes.size(), *stream);
    stream->synchronize();
    return decode(bytes, dt);
  }
  Ids get_ids(const std::string& name, std::size_t n) {
    Ids v(n);
    if (n > 0) {
      device->copy_to_host(v.data(), ints.at(name).device<std::byte>(), n * sizeof(std::int32_t),
                           *stream);
    }
    stream->synchronize();
    return v;
  }
};

// A whole MoE layer forward and backward through the ops, as a model composes them: router,
// dispatch plan, gather, two grouped linears, combine, the load-balancing statistics and their
// gradient, the z-loss, and every backward. Inputs from the counter RNG (seed, streams stream0 ..
// stream0 + 4; expert weights of scale `weight_scale`). Returns the outputs and gradients as
// stored, in a fixed order (decoding is exact, so equal vectors are equal bits): probs, weights,
// out, dx, dwu, dwd, dl, dw, stats_p, z.
inline std::vector<Vec> run_moe_layer(MoeBackend& be, DType dt, int N, int E, int k, int C, int I,
                                      std::uint64_t seed, std::uint64_t stream0,
                                      double weight_scale) {
  using namespace kernels;
  const Bytes logits = be.put("logits", normal_values(seed, stream0, N * E, 2.0), dt);
  const Bytes x = be.put("x", normal_values(seed, stream0 + 1, N * C), dt);
  const Bytes wu = be.put("wu", normal_values(seed, stream0 + 2, E * I * C, weight_scale), dt);
  const Bytes wd = be.put("wd", normal_values(seed, stream0 + 3, E * C * I, weight_scale), dt);
  const Bytes g = be.put("g", normal_values(seed, stream0 + 4, N * C), dt);
  const Floats probs = be.put_f32("probs", Vec(N * E));
  const Floats weights = be.put_f32("weights", Vec(N * k));
  const Ints experts = be.put_ids("experts", Ids(N * k));
  const Ints counts = be.put_ids("counts", Ids(E));
  const Ints offsets = be.put_ids("offsets", Ids(E + 1));
  const Ints row_of = be.put_ids("row_of", Ids(N * k));
  const Ints source = be.put_ids("source", Ids(N * k));
  const Bytes xe = be.put("xe", Vec(N * k * C), dt);
  const Bytes h = be.put("h", Vec(N * k * I), dt);
  const Bytes y = be.put("y", Vec(N * k * C), dt);
  const Bytes out = be.put("out", Vec(N * C), dt);
  const Bytes dy = be.put("dy", Vec(N * k * C), dt);
  const Floats dw = be.put_f32("dw", Vec(N * k));
  const Bytes dh = be.put("dh", Vec(N * k * I), dt);
  const Bytes dxe = be.put("dxe", Vec(N * k * C), dt);
  const Bytes dx = be.put("dx", Vec(N * C), dt);
  const Bytes dwu = be.put("dwu", Vec(E * I * C), DType::kFloat32);
  const Bytes dwd = be.put("dwd", Vec(E * C * I), DType::kFloat32);
  const Bytes dl = be.put("dl", Vec(N * E), dt);
  const Floats stats_c = be.put_f32("stats_c", Vec(E, 0.0));
  const Floats stats_p = be.put_f32("stats_p", Vec(E, 0.0));
  const Floats dshared = be.put_f32("dshared", Vec(E));
  const Floats z = be.put_f32("z", Vec(1));
  moe_router_forward(*be.ctx, dt, probs, weights, experts, logits, N, E, k, true);
  moe_dispatch_plan(*be.ctx, counts, offsets, row_of, source, experts, N, k, E);
  const Ids host_offsets = be.get_ids("offsets", E + 1);
  moe_gather(*be.ctx, dt, xe, x, row_of, N, k, C);
  grouped_linear_forward(*be.ctx, dt, h, xe, wu, host_offsets, E, C, I);
  grouped_linear_forward(*be.ctx, dt, y, h, wd, host_offsets, E, I, C);
  moe_combine(*be.ctx, dt, out, y, weights, row_of, N, k, C);
  moe_aux_stats_accumulate(*be.ctx, stats_c, stats_p, probs, experts, N, E, k);
  moe_load_balancing_loss_backward(*be.ctx, dshared, stats_c, 0.01f, E, N);
  moe_router_z_loss_forward(*be.ctx, dt, z, logits, N, E);
  moe_combine_backward(*be.ctx, dt, dy, dw, g, y, weights, row_of, N, k, C);
  grouped_linear_backward(*be.ctx, dt, DType::kFloat32, dh, dwd, dy, h, wd, host_offsets, E, I, C,
                          GradWrite::kOverwrite);
  grouped_linear_backward(*be.ctx, dt, DType::kFloat32, dxe, dwu, dh, xe, wu, host_offsets, E, C, I,
                          GradWrite::kOverwrite);
  moe_gather_backward(*be.ctx, dt, dx, dxe, row_of, N, k, C);
  moe_router_backward(*be.ctx, dt, dl, dw, probs, experts, dshared, N, E, k, true,
                      GradWrite::kOverwrite);
  return {be.get("probs", N * E), be.get("weights", N * k), be.get("out", N * C),
          be.get("dx", N * C),    be.get("dwu", E * I * C), be.get("dwd", E * C * I),
          be.get("dl", N * E),    be.get("dw", N * k),      be.get("stats_p", E),
          be.get("z", 1)};
}

}  // namespace zrt::test
