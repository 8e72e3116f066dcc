#include "kernels/cuda/cudnn_attention.h"

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/residual.cuh"
#include "runtime/common/error.h"
#include "runtime/device/device_access.h"

#if ZRT_HAVE_CUDNN_ATTENTION
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace zrt::kernels::cuda {

bool cudnn_attention_may_take(const KernelOptions& options, DType dtype, bool masked) {
  return options.cuda_attention_cudnn && cudnn_attention_built() && !masked &&
         (dtype == DType::kBFloat16 || dtype == DType::kFloat16);
}

#if !ZRT_HAVE_CUDNN_ATTENTION

bool cudnn_attention_built() {
  return false;
}

// CMake says why (ZRT_CUDNN_ATTENTION_ABSENT, cmake/ZrtCuda.cmake).
std::string cudnn_attention_missing_reason() {
  return ZRT_CUDNN_ATTENTION_ABSENT;
}

std::string cudnn_attention_validate(const CudnnAttentionShape&, bool, int) {
  return cudnn_attention_missing_reason();
}

bool cudnn_attention_forward(KernelContext&, const CudnnAttentionShape&, void*, float*, const void*,
                             const void*, const void*) {
  return false;
}
bool cudnn_attention_backward(KernelContext&, const CudnnAttentionShape&, void*, void*, void*,
                              const void*, const void*, const void*, const void*, const void*,
                              const float*, bool) {
  return false;
}

#else  // ZRT_HAVE_CUDNN_ATTENTION

namespace fe = cudnn_frontend;

bool cudnn_attention_built() {
  return true;
}
std::string cudnn_attention_missing_reason() {
  return "";
}

namespace {

using Uid = fe::graph::Tensor_attributes::uid_t;
constexpr Uid kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kdO = 6, kdQ = 7, kdK = 8, kdV = 9;

// One graph: a pass at one shape.
struct GraphKey {
  bool backward;
  DType dtype;
  int B, T, NH, NKV, hs;
  QkvLayout layout;
  bool deterministic;  // backward only (false in every forward key)
  int window;          // sliding window; 0: none
  bool operator<(const GraphKey& o) const {
    return std::tie(backward, dtype, B, T, NH, NKV, hs, layout, deterministic, window) <
           std::tie(o.backward, o.dtype, o.B, o.T, o.NH, o.NKV, o.hs, o.layout, o.deterministic,
                    o.window);
  }
};

// A (B, heads, T, hs) view of rows of `row` elements, one per token, heads `hs` apart.
struct View {
  std::vector<std::int64_t> dims, strides;
};
View heads_view(const GraphKey& k, int heads, std::int64_t row) {
  return {{k.B, heads, k.T, k.hs}, {std::int64_t{k.T} * row, k.hs, row, 1}};
}

// The views of q, k, v (and their gradients) and of out (and dout) for a key's layout.
struct Views {
  View q, k, v, out;
};
Views views_of(const GraphKey& key) {
  const std::int64_t q_row = std::int64_t{key.NH} * key.hs;
  if (key.layout == QkvLayout::kPacked) {  // (B,T,3C): q, k, v interleaved per token
    return {heads_view(key, key.NH, 3 * q_row), heads_view(key, key.NKV, 3 * q_row),
            heads_view(key, key.NKV, 3 * q_row), heads_view(key, key.NH, q_row)};
  }
  const std::int64_t kv_row = std::int64_t{key.NKV} * key.hs;
  return {heads_view(key, key.NH, q_row), heads_view(key, key.NKV, kv_row),
          heads_view(key, key.NKV, kv_row), heads_view(key, key.NH, q_row)};
}

// Elements of q, k, v (or their gradients) in a key's layout, and where k and v start.
struct Extent {
  std::int64_t total, k_offset, v_offset;
};
Extent qkv_extent(const GraphKey& key) {
  const std::int64_t tokens = std::int64_t{key.B} * key.T;
  const std::int64_t q = tokens * key.NH * key.hs, kv = tokens * key.NKV * key.hs;
  if (key.layout == QkvLayout::kPacked) {
    return {3 * q, std::int64_t{key.NH} * key.hs, 2 * std::int64_t{key.NH} * key.hs};
  }
  return {q + 2 * kv, q, q + kv};
}

std::string describe_key(const GraphKey& k) {
  return fmt::format("{} B={} T={} heads {}/{} hs {} {}{}{}", k.backward ? "backward" : "forward",
                     k.B, k.T, k.NH, k.NKV, k.hs, dtype_name(k.dtype),
                     k.backward ? (k.deterministic ? " deterministic" : " non-deterministic") : "",
                     k.window > 0 ? fmt::format(" window {}", k.window) : "");
}

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN declined the shape (`refused` says why)
  std::int64_t workspace_bytes = 0;
  std::string refused;
};

fe::graph::Tensor_attributes tensor(const char* name, Uid uid, const View& view) {
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(view.dims).set_stride(
      view.strides);
}

// The graph of one pass at one shape, not yet built for a device. sm_version > 0 names the
// compute capability to check it for (its nodes take it when made); 0 asks the current device.
std::shared_ptr<fe::graph::Graph> make_graph(const GraphKey& key, int sm_version = 0) {
  auto graph = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) graph->set_sm_version(sm_version);
  graph
      ->set_io_data_type(key.dtype == DType::kBFloat16 ? fe::DataType_t::BFLOAT16
                                                       : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const Views v = views_of(key);
  const View stats{{key.B, key.NH, key.T, 1}, {std::int64_t{key.NH} * key.T, key.T, 1, 1}};
  const float scale = 1.0f / std::sqrt(static_cast<float>(key.hs));
  auto q = graph->tensor(tensor("q", kQ, v.q));
  auto k = graph->tensor(tensor("k", kK, v.k));
  auto vv = graph->tensor(tensor("v", kV, v.v));
  if (!key.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("zrt causal attention")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
    // A sliding window: the keys k with q - k < window stay (the band's left bound, compared as
    // col + bound > row), transformers' sliding_window mask.
    if (key.window > 0) options.set_diagonal_band_left_bound(key.window);
    auto [o, lse] = graph->sdpa(q, k, vv, options);
    o->set_output(true).set_uid(kO).set_dim(v.out.dims).set_stride(v.out.strides);
    lse->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats.dims)
        .set_stride(stats.strides);
  } else {
    auto o = graph->tensor(tensor("out", kO, v.out));
    auto dout = graph->tensor(tensor("dout", kdO, v.out));
    auto lse = graph->tensor(tensor("lse", kStats, stats).set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("zrt causal attention backward")
                       .set_causal_mask(true)
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(key.deterministic);
    if (key.window > 0) options.set_diagonal_band_left_bound(key.window);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, vv, o, dout, lse, options);
    // The gradients in q, k, v's own layout: in place, or in workspace laid out the same.
    dq->set_output(true).set_uid(kdQ).set_dim(v.q.dims).set_stride(v.q.strides);
    dk->set_output(true).set_uid(kdK).set_dim(v.k.dims).set_stride(v.k.strides);
    dv->set_output(true).set_uid(kdV).set_dim(v.v.dims).set_stride(v.v.strides);
  }
  return graph;
}

BuiltGraph build_graph(cudnnHandle_t handle, const GraphKey& key) try {
  std::shared_ptr<fe::graph::Graph> graph = make_graph(key);
  BuiltGraph built;
  const auto step = [&](const char* what, fe::error_t status) {
    if (status.is_bad() && built.refused.empty()) {
      built.refused = fmt::format("{}: {}", what, status.get_message());
    }
    return built.refused.empty();
  };
  if (step("validate", graph->validate()) &&
      step("build_operation_graph", graph->build_operation_graph(handle)) &&
      step("create_execution_plans", graph->create_execution_plans({fe::HeurMode_t::A})) &&
      step("check_support", graph->check_support(handle)) &&
      step("build_plans", graph->build_plans(handle)) &&
      step("get_workspace_size", graph->get_workspace_size(built.workspace_bytes))) {
    built.graph = std::move(graph);
  }
  return built;
} catch (const std::exception& e) {  // the frontend throws from a few places (a missing library)
  BuiltGraph refused;
  refused.refused = fmt::format("the cuDNN frontend threw: {}", e.what());
  return refused;
}

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw Error(file, line,
              fmt::format("{} failed: {} (cuDNN status {})", call, cudnnGetErrorString(status),
                          static_cast<int>(status)));
}
#define ZRT_CUDNN_CHECK(call) check_cudnn((call), #call, __FILE__, __LINE__)

constexpr std::int64_t round_up_256(std::int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

// One KernelContext's cuDNN handle (bound to its stream) and the graphs built so far.
struct CudnnAttentionState {
  cudnnHandle_t handle = nullptr;
  std::map<GraphKey, BuiltGraph> graphs;
  ~CudnnAttentionState() {
    if (handle == nullptr) return;
    if (const cudnnStatus_t s = cudnnDestroy(handle); s != CUDNN_STATUS_SUCCESS) {
      spdlog::error("cudnnDestroy failed: {}", cudnnGetErrorString(s));
    }
  }
};

namespace {

// The graph for `key`, built on first use; null when cuDNN declines it or its workspace is above
// the kernels' limit and above `own_workspace` (what zrt's kernels would ask for the pass; both
// functions of the key, so the decision is the key's), logged once.
const BuiltGraph& graph_for(CudaKernelState& state, const GraphKey& key,
                            const AttentionKernels& kernels, std::int64_t own_workspace) {
  if (!state.cudnn_attention) {
    auto cudnn = std::make_shared<CudnnAttentionState>();
    ZRT_CUDNN_CHECK(cudnnCreate(&cudnn->handle));
    ZRT_CUDNN_CHECK(cudnnSetStream(cudnn->handle, state.stream));
    spdlog::info("cuDNN attention: cuDNN {}, frontend {}", cudnnGetVersion(),
                 CUDNN_FRONTEND_VERSION);
    state.cudnn_attention = std::move(cudnn);
  }
  auto& graphs = state.cudnn_attention->graphs;
  if (auto it = graphs.find(key); it != graphs.end()) return it->second;
  const auto start = std::chrono::steady_clock::now();
  BuiltGraph built = build_graph(state.cudnn_attention->handle, key);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (built.graph && !cudnn_attention_within_limit(kernels, built.workspace_bytes, own_workspace)) {
    // Not a failure: the deterministic backward's workspace grows with T^2, zrt's kernels' does
    // not. The run goes on, and says how to have cuDNN anyway.
    spdlog::info(
        "cuDNN attention: {} would need {:.2f} GiB of workspace, above the automatic choice's "
        "{:.2f} GiB: zrt's kernels run it (ZRT_CUDA_ATTENTION=cudnn takes it at any workspace, "
        "cudnn-nondeterministic with a workspace linear in T)",
        describe_key(key), static_cast<double>(built.workspace_bytes) / (1 << 30),
        static_cast<double>(kernels.cudnn_workspace_limit) / (1 << 30));
    built.graph.reset();
    built.refused = "workspace above the limit";
  } else if (built.graph) {
    spdlog::info("cuDNN attention: {} built in {:.0f} ms (workspace {} bytes)", describe_key(key),
                 ms, built.workspace_bytes);
  } else {
    spdlog::warn("cuDNN attention declines {} ({}); zrt's kernels run it", describe_key(key),
                 built.refused);
  }
  return graphs.emplace(key, std::move(built)).first->second;
}

GraphKey key_of(const CudnnAttentionShape& s, bool backward) {
  return {backward, s.dtype, s.B, s.T, s.NH, s.NKV, s.hs, s.layout, backward && s.deterministic,
          s.window};
}

void execute(CudaKernelState& state, const BuiltGraph& built,
             std::unordered_map<Uid, void*>& pointers, void* workspace, const GraphKey& key) {
  fe::error_t status = built.graph->execute(state.cudnn_attention->handle, pointers, workspace);
  ZRT_CHECK(status.is_good(), "cuDNN attention {}: execute failed: {}", describe_key(key),
            status.get_message());
}

}  // namespace

std::string cudnn_attention_validate(const CudnnAttentionShape& shape, bool backward,
                                     int sm_version) {
  // With the architecture given, the frontend asks no device for it.
  fe::error_t status = make_graph(key_of(shape, backward), sm_version)->validate();
  return status.is_good() ? std::string() : status.get_message();
}

bool cudnn_attention_forward(KernelContext& ctx, const CudnnAttentionShape& shape, void* out,
                             float* lse, const void* q, const void* k, const void* v) {
  CudaKernelState& state = *ctx.cuda();
  const GraphKey key = key_of(shape, false);
  const BuiltGraph& built =
      graph_for(state, key, attention_kernels(ctx.options()), shape.own_workspace);
  if (!built.graph) return false;
  const std::size_t element = dtype_size(shape.dtype);
  const auto* base = static_cast<const std::byte*>(q);
  const Extent extent = qkv_extent(key);
  if (shape.layout == QkvLayout::kPacked) {
    k = base + extent.k_offset * element;
    v = base + extent.v_offset * element;
  }
  std::unordered_map<Uid, void*> pointers = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, out},
                                             {kStats, lse}};
  void* workspace = built.workspace_bytes > 0
                        ? device_access::raw(ctx.workspace(built.workspace_bytes))
                        : nullptr;
  execute(state, built, pointers, workspace, key);
  ++state.cudnn_attention_forwards;
  return true;
}

bool cudnn_attention_backward(KernelContext& ctx, const CudnnAttentionShape& shape, void* dq,
                              void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, bool in_place) {
  CudaKernelState& state = *ctx.cuda();
  const GraphKey key = key_of(shape, true);
  const BuiltGraph& built =
      graph_for(state, key, attention_kernels(ctx.options()), shape.own_workspace);
  if (!built.graph) return false;
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(shape.dtype));
  const Extent extent = qkv_extent(key);
  if (shape.layout == QkvLayout::kPacked) {  // k, v and their gradients within the (B,T,3C) rows
    const auto* base = static_cast<const std::byte*>(q);
    k = base + extent.k_offset * element;
    v = base + extent.v_offset * element;
    dk = static_cast<std::byte*>(dq) + extent.k_offset * element;
    dv = static_cast<std::byte*>(dq) + extent.v_offset * element;
  }
  // Workspace: cuDNN's own, then, unless the gradients are written in place, room for them in q, k,
  // v's layout (cuDNN overwrites its outputs; the op adds).
  const std::int64_t own_bytes = round_up_256(built.workspace_bytes);
  const std::int64_t scratch_bytes = in_place ? 0 : extent.total * element;
  auto* workspace =
      own_bytes + scratch_bytes > 0
          ? static_cast<std::byte*>(device_access::raw(ctx.workspace(own_bytes + scratch_bytes)))
          : nullptr;
  std::byte* scratch = in_place ? nullptr : workspace + own_bytes;
  void* dq_to = in_place ? dq : scratch;
  void* dk_to = in_place ? dk : scratch + extent.k_offset * element;
  void* dv_to = in_place ? dv : scratch + extent.v_offset * element;
  std::unordered_map<Uid, void*> pointers = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, const_cast<void*>(out)},
                                             {kdO, const_cast<void*>(dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kdQ, dq_to},
                                             {kdK, dk_to},
                                             {kdV, dv_to}};
  execute(state, built, pointers, built.workspace_bytes > 0 ? workspace : nullptr, key);
  if (!in_place) {
    const Launch l = make_launch(state, nullptr);
    if (shape.layout == QkvLayout::kPacked) {  // dqkv and the scratch share the (B,T,3C) layout
      residual_forward(l, shape.dtype, dq, dq, scratch, extent.total);
    } else {
      residual_forward(l, shape.dtype, dq, dq, scratch, extent.k_offset);
      residual_forward(l, shape.dtype, dk, dk, dk_to, extent.v_offset - extent.k_offset);
      residual_forward(l, shape.dtype, dv, dv, dv_to, extent.total - extent.v_offset);
    }
  }
  ++state.cudnn_attention_backwards;
  return true;
}

#endif  // ZRT_HAVE_CUDNN_ATTENTION

}  // namespace zrt::kernels::cuda
