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

}  // namespace zrt::test
