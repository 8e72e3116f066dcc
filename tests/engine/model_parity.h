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
#include "runtime/comm/parallel_layout.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/engine/engine_parallel_dims.h"
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
  // A mixture of experts: also train at expert_parallel.autoep_size 2 and 4 (where they divide
  // the world and `num_experts`), each rank holding its block of the experts (parameters named
  // by their global expert, moe_model.h), at stages 0-3 (stage 3 also with checkpointing and
  // offload, stage 2 with offload), against the same reference.
  int num_experts = 0;
  std::vector<int> expert_parallel_sizes = {2, 4};
  bool only_expert_parallel = false;  // skip the every-expert-local variants
  // comm.check_collective_sequence on the layout's groups (expert-parallel variants).
  bool check_collective_sequence = false;
  // Parameters not trained (ParamSpec::frozen, by name; empty: none): the reference leaves
  // them out of the norm and the update; they must come back bit for bit as initialised.
  std::function<bool(const std::string& name)> frozen;
  // Where the engine's backward must end with them (ParamAccess::first_backward_module); -1:
  // not checked.
  int first_backward_module = -1;
  // Applied to every initial value after the model's own (both runs): e.g. a router forcing
  // every token to one expert.
  std::function<void(const std::string& name, std::int64_t first, std::int64_t count, float* out)>
      adjust_init = [](const std::string&, std::int64_t, std::int64_t, float*) {};
};

// What a run gives besides its parameters: per step the loss, the gradient's global norm and
// (a mixture of experts) the (token, slot) pairs each expert received over the global batch.
struct ParitySteps {
  std::vector<double> losses, norms;
  std::vector<std::vector<std::int64_t>> loads;
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

// Marks pc.frozen's parameters in `specs`.
inline void mark_parity_frozen(const ParityCase& pc, std::vector<ParamSpec>& specs) {
  if (!pc.frozen) return;
  for (ParamSpec& p : specs) p.frozen = pc.frozen(p.name);
}

// One process, the whole global batch accumulated over `micro_batches` micro-batches (1: all in
// one), each scaled by 1 / micro_batches so the gradient is the mean over the global batch.
inline std::vector<std::vector<float>> parity_reference(const ParityCase& pc, int micro_batches,
                                                        std::vector<double>* losses,
                                                        ParitySteps* steps = nullptr) {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("reference");
  kernels::KernelContext ctx(*device, *stream);
  const auto def = builtin_models().parse_spec(pc.spec);
  const auto model = def->build(ctx, ModelOptions{});
  const int T = def->seq_len();
  FlatParamAccess flat(*device, *stream, model->parameters(), model->num_modules(), DType::kFloat32,
                       DType::kFloat32);
  flat.init_from(*model, 7);
  std::vector<ParamSpec> specs = model->parameters();
  mark_parity_frozen(pc, specs);
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    std::vector<float> x = flat.read_param(i);
    pc.adjust_init(specs[static_cast<std::size_t>(i)].name, 0, static_cast<std::int64_t>(x.size()),
                   x.data());
    flat.set_param(i, x);
  }
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
      if (specs[static_cast<std::size_t>(i)].frozen) continue;
      for (float x : g.back()) norm_sq += static_cast<double>(x) * x;
    }
    if (steps != nullptr) {
      steps->norms.push_back(std::sqrt(norm_sq));
      if (auto load = model->take_expert_load()) steps->loads.push_back(load->tokens);
    }
    const double c = pc.clip / (std::sqrt(norm_sq) + 1e-6);
    const double coef = c < 1.0 ? c : 1.0;
    reference_adamw(p, m, v, g, coef, step + 1, pc.lr, pc.weight_decay, specs);
    for (int i = 0; i < static_cast<int>(specs.size()); ++i)
      flat.set_param(i, p[static_cast<std::size_t>(i)]);
  }
  return p;
}

// The reference's parameters (ep-1 names) from an engine's: an expert's own parameter under
// expert parallelism (mlp.experts.{e}.gate_up_proj / down_proj) is its rows of the fused one,
// written by the first rank of its expert-data-parallel group and summed over the world (zeros
// elsewhere: the sum is exact).
inline std::vector<std::vector<float>> reference_layout(const std::vector<ParamSpec>& reference,
                                                        const std::vector<ParamSpec>& own,
                                                        std::vector<std::vector<float>> values,
                                                        bool writes_experts) {
  std::vector<std::vector<float>> out;
  for (const ParamSpec& ref : reference) {
    std::vector<float> full(static_cast<std::size_t>(ref.numel()), 0.0f);
    bool found = false, fused_experts = false;
    for (std::size_t i = 0; i < own.size(); ++i) {
      if (own[i].name == ref.name) {
        full = values[i];
        found = true;
      }
      // "model.layers.{l}.mlp.experts.{e}.gate_up_proj" beside "...mlp.experts.gate_up_proj"
      const std::string kind = ref.name.substr(ref.name.rfind('.') + 1);
      const std::string head = ref.name.substr(0, ref.name.rfind('.') + 1);
      if (own[i].group == 1 && own[i].name.compare(0, head.size(), head) == 0 &&
          own[i].name.size() > kind.size() &&
          own[i].name.compare(own[i].name.size() - kind.size(), kind.size(), kind) == 0) {
        fused_experts = true;
        const int e = std::stoi(own[i].name.substr(head.size()));
        if (writes_experts) {
          std::copy(values[i].begin(), values[i].end(), full.begin() + e * own[i].numel());
        }
      }
    }
    if (fused_experts) {
      MPI_Allreduce(MPI_IN_PLACE, full.data(), static_cast<int>(full.size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    } else {
      REQUIRE(found);
    }
    out.push_back(std::move(full));
  }
  return out;
}

inline std::vector<std::vector<float>> parity_engine(const ParityCase& pc, EngineOptions options,
                                                     bool checkpointing,
                                                     std::vector<double>* losses,
                                                     ParitySteps* steps = nullptr) {
  auto device = make_device(DeviceOptions{});
  auto compute = device->create_stream("compute");
  auto comm = device->create_stream("comm");
  auto control = device->create_stream("control");
  auto group = make_process_group(*device, MPI_COMM_WORLD, *comm, "parity");
  // Expert parallelism: the layout's expert-parallel group for the model, its table of shard
  // groups for the engine.
  std::unique_ptr<ParallelLayout> layout;
  if (options.expert_parallel_size > 1) {
    CommOptions comm_options;
    comm_options.check_collective_sequence = pc.check_collective_sequence;
    layout =
        std::make_unique<ParallelLayout>(*device, MPI_COMM_WORLD, *comm, *control,
                                         parallel_dims(options, group->size(), 0), comm_options);
  }
  kernels::KernelContext ctx(*device, *compute);
  const auto def = builtin_models().parse_spec(pc.spec);
  ModelOptions model_options;
  model_options.activation_checkpointing = checkpointing;
  model_options.expert_group = layout ? layout->expert_parallel_group() : nullptr;
  const auto model = def->build(ctx, model_options);
  AdamOptions adam;
  adam.lr = pc.lr;
  adam.weight_decay = pc.weight_decay;
  auto optimizer = make_device_adam(*device, adam);
  options.gradient_clipping = pc.clip;
  // As zrt-train builds it: the backward ends at the lowest module with a trained parameter
  // (the reference runs the whole backward).
  take_model_capabilities(options, *model);
  std::vector<ParamSpec> params = model->parameters();
  mark_parity_frozen(pc, params);
  std::unique_ptr<ZeroEngine> engine_owner =
      layout ? std::make_unique<ZeroEngine>(*device, *compute, layout->engine_groups(), params,
                                            model->num_modules(), options, *optimizer,
                                            make_cpu_optimizer_offload)
             : std::make_unique<ZeroEngine>(*device, *compute, *group, params, model->num_modules(),
                                            options, *optimizer, make_cpu_optimizer_offload);
  ZeroEngine& engine = *engine_owner;
  if (pc.first_backward_module >= 0)
    REQUIRE(engine.first_backward_module() == pc.first_backward_module);
  engine.initialize([&](int p, std::int64_t first, std::int64_t count, float* out) {
    model->init_parameter(p, 7, first, count, out);
    pc.adjust_init(model->parameters()[static_cast<std::size_t>(p)].name, first, count, out);
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
    if (steps != nullptr) {
      if (auto load = model->take_expert_load()) {
        MPI_Allreduce(MPI_IN_PLACE, load->tokens.data(), static_cast<int>(load->tokens.size()),
                      MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        steps->loads.push_back(load->tokens);
      }
    }
    const StepResult info = engine.step(pc.lr);
    if (steps != nullptr) steps->norms.push_back(info.grad_norm);
    compute->synchronize();
  }
  std::vector<std::vector<float>> out;
  for (int p = 0; p < static_cast<int>(model->parameters().size()); ++p) {
    out.push_back(engine.full_parameter(p));
  }
  if (!layout) return out;
  return reference_layout(def->parameters(), model->parameters(), std::move(out),
                          layout->expert_data_parallel_group()->rank() == 0);
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
  ParitySteps ref_steps;
  const auto expected =
      parity_reference(pc, pc.per_forward_terms ? world : 1, &ref_losses, &ref_steps);
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
  std::string widest_name;
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const auto want = pc.parts(specs[p].name, whole[p]);
    const auto two = pc.parts(specs[p].name, split2[p]);
    const auto four = pc.parts(specs[p].name, split4[p]);
    for (std::size_t k = 0; k < want.size(); ++k) {
      const double sensitivity =
          std::max(relative_l2(two[k], want[k]), relative_l2(four[k], want[k]));
      bounds[p].push_back(kReassociationFactor * sensitivity + adam_floor);
      if (bounds[p].back() > widest) {
        widest = bounds[p].back();
        widest_name = specs[p].name + (want.size() > 1 ? " part " + std::to_string(k) : "");
      }
    }
  }
  WARN(pc.spec << ": re-association sensitivity here (ZRT_CPU_ISA "
               << cpu_isa_name(active_cpu_isa()) << ", " << pc.steps
               << " steps): widest per-tensor bound " << widest << " (" << widest_name << ")");
  // A bound this wide would hide real defects: the sensitivity itself must stay far below what
  // a defect does. pc.lr (3e-3) over ten AdamW steps moves an element by up to 3e-2, against
  // initial values of std 0.02: a defect in a tensor's gradients (a missing 1/ep, a token's
  // contribution dropped, a row sent to the wrong expert) changes the tensor by a share of its
  // update, orders above 1e-3 of its norm. The rounding's own spread depends on the kernels the
  // machine runs (measured: up to 4.4e-5 on AVX2 and 5.1e-5 scalar, 1.14e-4 on an AVX-512
  // Emerald Rapids for the tied embedding of the tiny Qwen2-MoE), so the guard sits at 1e-3.
  REQUIRE(widest < 1e-3);
  struct Variant {
    int stage;
    bool checkpointing;
    bool offload;
    int ep;
  };
  auto check_variant = [&](const Variant& v) {
    EngineOptions o;
    o.stage = v.stage;
    o.reduce_bucket_size = 20000;
    o.stage3_param_persistence_threshold = 200;
    o.stage3_prefetch_bucket_size = 40000;
    o.offload_optimizer.enabled = v.offload;
    o.offload_param.enabled = v.offload && v.stage == 3;
    o.expert_parallel_size = v.ep;
    std::vector<double> losses;
    ParitySteps got_steps;
    const auto got = parity_engine(pc, o, v.checkpointing, &losses, &got_steps);
    double worst = 0.0, worst_ratio = 0.0;
    for (std::size_t p = 0; p < got.size(); ++p) {
      INFO(pc.spec << ": stage " << v.stage << " checkpointing " << v.checkpointing << " offload "
                   << v.offload << " autoep_size " << v.ep << " parameter " << specs[p].name);
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
      if (pc.frozen && pc.frozen(specs[p].name)) {
        // Untouched: the initial values, bit for bit (the reference never changes them).
        CHECK(got[p] == expected[p]);
      }
    }
    WARN(pc.spec << ": stage " << v.stage << (v.checkpointing ? " +checkpointing" : "")
                 << (v.offload ? " +offload" : "") << " autoep_size " << v.ep
                 << ": worst per-tensor relative L2 error " << worst << ", worst error / bound "
                 << worst_ratio);
    REQUIRE(losses.size() == ref_losses.size());
    for (int s = 0; s < pc.steps; ++s) {
      INFO("autoep_size " << v.ep << " step " << s);
      CHECK(losses[s] == Approx(ref_losses[s]).epsilon(1e-6));
      if (v.ep > 1 || pc.frozen) {
        // The gradient itself, not only the Adam step it gave: its norm as the reference's (the
        // same re-association of the same sums as the parameters'); with frozen parameters,
        // the norm of the trained ones only. A sum of squares over thousands of elements, each
        // off by the few-ulp (2^-24 relative) re-association of its gradient's sum over ranks and
        // micro-batches: the norm moves by about that much, far inside 1e-5.
        CHECK(got_steps.norms[s] == Approx(ref_steps.norms[s]).epsilon(1e-5));
      }
      if (v.ep > 1) {
        // Every rank counts its own tokens' routing: summed, the global batch's, as every
        // expert local.
        REQUIRE(got_steps.loads.size() == ref_steps.loads.size());
        CHECK(got_steps.loads[s] == ref_steps.loads[s]);
      }
    }
  };
  for (const Variant& v :
       {Variant{0, false, false, 1}, Variant{1, false, false, 1}, Variant{2, false, false, 1},
        Variant{3, false, false, 1}, Variant{3, true, false, 1}, Variant{2, false, true, 1},
        Variant{3, true, true, 1}}) {
    if (!pc.only_expert_parallel) check_variant(v);
  }
  for (int ep : pc.expert_parallel_sizes) {
    if (pc.num_experts == 0 || ep > world || world % ep != 0 || pc.num_experts % ep != 0) continue;
    // Stage 0: the experts whole on each rank of their group, all-reduced over it.
    for (const Variant& v :
         {Variant{0, false, false, ep}, Variant{1, false, false, ep}, Variant{2, false, false, ep},
          Variant{3, false, false, ep}, Variant{3, true, false, ep}, Variant{2, false, true, ep},
          Variant{3, true, true, ep}}) {
      check_variant(v);
    }
  }
  if (pc.only_expert_parallel) return;
  CHECK(ref_losses.front() == Approx(std::log(256.0)).epsilon(0.02));  // random init: ln V
  // Ten steps of lr 3e-3 learn the data's byte distribution (a different batch each step).
  if (pc.steps >= 10 && pc.expect_learning) CHECK(ref_losses.back() < ref_losses.front());
}

}  // namespace zrt::test
