// A registry model under the engine against a plain single-process loop over the whole global
// batch (FlatParamAccess, AdamW written out in double, clipping): every stage (stage 3 also with
// activation checkpointing, and with offload), at the world size mpirun gives. Shared by
// test_engine_gpt.cc and test_engine_llama.cc; the derivation of the tolerance is in
// test_engine_gpt.cc's file comment.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/flat_param_access.h"
#include "models/model_registry.h"
#include "offload/cpu_optimizer_offload.h"
#include "optimizers/device_adam.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/engine/zero_engine.h"
#include "tests/engine/engine_test_util.h"

namespace zrt::test {

struct ParityCase {
  std::string spec;  // a registry spec with vocab_size 256
  int steps = 3;
  int global_batch = 4;
  double lr = 3e-3;
  double weight_decay = 0.1;
  double clip = 0.5;
  // The relatively compared parts of a parameter (default: the whole tensor). A part whose
  // gradient is exactly zero in exact arithmetic (an attention key bias) is left out: Adam turns
  // its rounding noise into lr-sized updates; `absolute` checks such elements instead.
  std::function<std::vector<std::vector<float>>(const std::string&, const std::vector<float>&)>
      parts = [](const std::string&, const std::vector<float>& x) {
        return std::vector<std::vector<float>>{x};
      };
  // A model whose loss has a term computed per forward over its own tokens (a mixture of
  // experts' load-balancing term, transformers' rule): the reference then runs one forward per
  // rank's rows (the engine's forwards), each scaled by 1 / world, instead of one over the global
  // batch. The re-association bounds come from `bounds_spec` (the same model without the term,
  // whose math does not depend on how the batch is split), or `spec` when empty.
  bool per_forward_terms = false;
  std::string bounds_spec;
  // Check that ten steps lower the loss. A model whose per-step losses vary with the batch by
  // more than ten steps of this lr lower them turns the check into a coin toss: false.
  bool expect_learning = true;
  // Extra absolute checks of parameter `name`'s engine result against the reference's.
  std::function<void(const std::string&, const std::vector<float>&, const std::vector<float>&)>
      absolute = [](const std::string&, const std::vector<float>&, const std::vector<float>&) {};
};

// Two re-associations of the same sums give rounding differences of the same size; over a tensor
// the relative L2 norm averages many elements, so one draw lands within a small factor of
// another. 4 leaves room for the smallest tensors (64 to 128 elements), where a few dominate.
constexpr double kReassociationFactor = 4.0;

// Inputs then targets of `rows` sequences of the global batch from `first_row`, byte-valued.
inline std::vector<std::int32_t> parity_tokens(int step, int first_row, int rows, int T) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(2 * rows * T));
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i <= T; ++i) {
      const auto v =
          static_cast<std::int32_t>(data_value(step, first_row + r, i, 7) * 127.5f + 127.5f) & 255;
      if (i < T) t[static_cast<std::size_t>(r * T + i)] = v;
      if (i > 0) t[static_cast<std::size_t>(rows * T + r * T + i - 1)] = v;
    }
  return t;
}

inline TokenBatch upload_tokens(Device& device, Stream& stream, Buffer& buffer,
                                const std::vector<std::int32_t>& t, int rows, int T) {
  // Ordered on the stream: a buffer replaced or destroyed (an exception unwinding the caller)
  // is released only after the work queued on it has read it.
  buffer = device.allocate(static_cast<std::int64_t>(t.size()) * 4, MemCategory::kActivations,
                           "tokens", MemorySpace::kDevice, &stream);
  device.copy_to_device(buffer.device<std::byte>(), t.data(), t.size() * 4, stream);
  TokenBatch b;
  b.inputs = buffer.device<std::int32_t>();
  b.targets = buffer.device<std::int32_t>() + rows * T;
  b.batch = rows;
  b.seq_len = T;
  return b;
}

// One process, the whole global batch accumulated over `micro_batches` micro-batches (1: all in
// one), each scaled by 1 / micro_batches so the gradient is the mean over the global batch.
inline std::vector<std::vector<float>> parity_reference(const ParityCase& pc, int micro_batches,
                                                        std::vector<double>* losses) {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("reference");
  kernels::KernelContext ctx(*device, *stream);
  const auto def = builtin_models().parse_spec(pc.spec);
  const auto model = def->build(ctx, ModelOptions{});
  const int T = def->seq_len();
  FlatParamAccess flat(*device, *stream, model->parameters(), model->num_modules(), DType::kFloat32,
                       DType::kFloat32);
  flat.init_from(*model, 7);
  const auto& specs = model->parameters();
  std::vector<std::vector<float>> p, m, v;
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    p.push_back(flat.read_param(i));
    m.emplace_back(p.back().size(), 0.f);
    v.emplace_back(p.back().size(), 0.f);
  }
  const int rows = pc.global_batch / micro_batches;
  for (int step = 0; step < pc.steps; ++step) {
    flat.zero_grads();
    double loss = 0.0;
    for (int mb = 0; mb < micro_batches; ++mb) {
      Buffer buf;
      const auto t = parity_tokens(step, mb * rows, rows, T);
      model->forward_backward(flat, upload_tokens(*device, *stream, buf, t, rows, T),
                              1.0f / static_cast<float>(micro_batches));
      float l = 0.0f;
      device->copy_to_host(&l, model->loss().as<const std::byte>(), sizeof l, *stream);
      stream->synchronize();
      loss += l;
    }
    losses->push_back(loss / micro_batches);
    std::vector<std::vector<float>> g;
    double norm_sq = 0.0;
    for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
      g.push_back(flat.read_grad(i));
      for (float x : g.back()) norm_sq += static_cast<double>(x) * x;
    }
    const double c = pc.clip / (std::sqrt(norm_sq) + 1e-6);
    const double coef = c < 1.0 ? c : 1.0;
    reference_adamw(p, m, v, g, coef, step + 1, pc.lr, pc.weight_decay, specs);
    for (int i = 0; i < static_cast<int>(specs.size()); ++i)
      flat.set_param(i, p[static_cast<std::size_t>(i)]);
  }
  return p;
}

inline std::vector<std::vector<float>> parity_engine(const ParityCase& pc, EngineOptions options,
                                                     bool checkpointing,
                                                     std::vector<double>* losses) {
  auto device = make_device(DeviceOptions{});
  auto compute = device->create_stream("compute");
  auto comm = device->create_stream("comm");
  auto group = make_process_group(*device, MPI_COMM_WORLD, *comm, "parity");
  kernels::KernelContext ctx(*device, *compute);
  const auto def = builtin_models().parse_spec(pc.spec);
  ModelOptions model_options;
  model_options.activation_checkpointing = checkpointing;
  const auto model = def->build(ctx, model_options);
  AdamOptions adam;
  adam.lr = pc.lr;
  adam.weight_decay = pc.weight_decay;
  auto optimizer = make_device_adam(*device, adam);
  options.gradient_clipping = pc.clip;
  ZeroEngine engine(*device, *compute, *group, model->parameters(), model->num_modules(), options,
                    *optimizer, make_cpu_optimizer_offload);
  engine.initialize([&](int p, std::int64_t first, std::int64_t count, float* out) {
    model->init_parameter(p, 7, first, count, out);
  });
  const int T = def->seq_len();
  const int rows = pc.global_batch / group->size();
  for (int step = 0; step < pc.steps; ++step) {
    Buffer buf;
    const auto t = parity_tokens(step, group->rank() * rows, rows, T);
    model->forward_backward(engine, upload_tokens(*device, *compute, buf, t, rows, T), 1.0f);
    float loss = 0.0f;
    device->copy_to_host(&loss, model->loss().as<const std::byte>(), sizeof loss, *compute);
    compute->synchronize();
    MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    losses->push_back(loss / group->size());
    engine.step(pc.lr);
    compute->synchronize();
  }
  std::vector<std::vector<float>> out;
  for (int p = 0; p < static_cast<int>(model->parameters().size()); ++p) {
    out.push_back(engine.full_parameter(p));
  }
  return out;
}

// The whole check: the reference, its re-association sensitivity (the bounds), then every
// stage / checkpointing / offload variant's parameters and per-step losses against it.
inline void check_engine_parity(const ParityCase& pc) {
  // fp32 AdamW against the reference's double AdamW: per step and element the update is rounded
  // a handful of times (< 8 ulp of |p| for |update| <= |p|); over the steps: steps x 8 x 2^-24.
  const double adam_floor = pc.steps * 8 * 0x1p-24;
  std::vector<double> ref_losses, unused;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto expected = parity_reference(pc, pc.per_forward_terms ? world : 1, &ref_losses);
  ParityCase sensitivity_case = pc;
  if (!pc.bounds_spec.empty()) sensitivity_case.spec = pc.bounds_spec;
  const auto whole = pc.bounds_spec.empty() && !pc.per_forward_terms
                         ? expected
                         : parity_reference(sensitivity_case, 1, &unused);
  const auto split2 = parity_reference(sensitivity_case, 2, &unused);
  const auto split4 = parity_reference(sensitivity_case, 4, &unused);
  const auto specs = builtin_models().parse_spec(pc.spec)->parameters();
  std::vector<std::vector<double>> bounds(specs.size());
  double widest = 0.0;
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const auto want = pc.parts(specs[p].name, whole[p]);
    const auto two = pc.parts(specs[p].name, split2[p]);
    const auto four = pc.parts(specs[p].name, split4[p]);
    for (std::size_t k = 0; k < want.size(); ++k) {
      const double sensitivity =
          std::max(relative_l2(two[k], want[k]), relative_l2(four[k], want[k]));
      bounds[p].push_back(kReassociationFactor * sensitivity + adam_floor);
      widest = std::max(widest, bounds[p].back());
    }
  }
  WARN(pc.spec << ": re-association sensitivity here (ZRT_CPU_ISA "
               << cpu_isa_name(active_cpu_isa()) << ", " << pc.steps
               << " steps): widest per-tensor bound " << widest);
  // A bound this wide would hide real defects: the sensitivity itself must stay at the rounding
  // level.
  REQUIRE(widest < 1e-4);
  struct Variant {
    int stage;
    bool checkpointing;
    bool offload;
  };
  for (const Variant& v :
       {Variant{0, false, false}, Variant{1, false, false}, Variant{2, false, false},
        Variant{3, false, false}, Variant{3, true, false}, Variant{2, false, true},
        Variant{3, true, true}}) {
    EngineOptions o;
    o.stage = v.stage;
    o.reduce_bucket_size = 20000;
    o.stage3_param_persistence_threshold = 200;
    o.stage3_prefetch_bucket_size = 40000;
    o.offload_optimizer.enabled = v.offload;
    o.offload_param.enabled = v.offload && v.stage == 3;
    std::vector<double> losses;
    const auto got = parity_engine(pc, o, v.checkpointing, &losses);
    double worst = 0.0, worst_ratio = 0.0;
    for (std::size_t p = 0; p < got.size(); ++p) {
      INFO(pc.spec << ": stage " << v.stage << " checkpointing " << v.checkpointing << " offload "
                   << v.offload << " parameter " << specs[p].name);
      const auto have = pc.parts(specs[p].name, got[p]);
      const auto want = pc.parts(specs[p].name, expected[p]);
      for (std::size_t k = 0; k < want.size(); ++k) {
        const double err = relative_l2(have[k], want[k]);
        INFO("part " << k << ": relative L2 error " << err << ", bound " << bounds[p][k]);
        worst = std::max(worst, err);
        worst_ratio = std::max(worst_ratio, err / bounds[p][k]);
        CHECK(err <= bounds[p][k]);
      }
      pc.absolute(specs[p].name, got[p], expected[p]);
    }
    WARN(pc.spec << ": stage " << v.stage << (v.checkpointing ? " +checkpointing" : "")
                 << (v.offload ? " +offload" : "") << ": worst per-tensor relative L2 error "
                 << worst << ", worst error / bound " << worst_ratio);
    REQUIRE(losses.size() == ref_losses.size());
    for (int s = 0; s < pc.steps; ++s) {
      INFO("step " << s);
      CHECK(losses[s] == Approx(ref_losses[s]).epsilon(1e-6));
    }
  }
  CHECK(ref_losses.front() == Approx(std::log(256.0)).epsilon(0.02));  // random init: ln V
  // Ten steps of lr 3e-3 learn the data's byte distribution (a different batch each step).
  if (pc.steps >= 10 && pc.expect_learning) CHECK(ref_losses.back() < ref_losses.front());
}

}  // namespace zrt::test
