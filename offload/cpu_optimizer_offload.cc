#include "offload/cpu_optimizer_offload.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "offload/cpu_step_pipeline.h"
#include "runtime/common/error.h"
#include "runtime/device/host_memory.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/unit_schedule.h"
#include "runtime/trace/trace_span.h"

namespace zrt {

namespace {

std::int64_t bytes_of(std::int64_t elements, DType type) {
  return elements * static_cast<std::int64_t>(dtype_size(type));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::unique_ptr<OptimizerOffload> make_cpu_optimizer_offload(const OffloadContext& context) {
  return std::make_unique<CpuOptimizerOffload>(context);
}

MemorySpace CpuOptimizerOffload::host_space(bool for_params) const {
  const OffloadOptions& o = for_params ? options_.offload_param : options_.offload_optimizer;
  return o.pin_memory ? MemorySpace::kPinnedHost : MemorySpace::kPageableHost;
}

CpuOptimizerOffload::CpuOptimizerOffload(const OffloadContext& context)
    : device_(context.device),
      comm_(context.comm),
      plan_(context.plan),
      params_(context.params),
      options_(context.options),
      rank_(context.rank),
      unit_ranks_(context.unit_ranks),
      offload_param_(context.options.offload_param.enabled),
      placement_(context.placement),
      trace_name_(lower(context.optimizer.spec().family)),
      host_optimizer_(context.optimizer.make_host_optimizer()),
      reduced_as_is_(offload_takes_reduced_slices(context.options)),
      grad_type_(reduced_as_is_ ? context.options.compute_dtype : context.options.grad_accum_dtype),
      piece_(context.options.offload_transfer_piece) {
  ZRT_CHECK(piece_ >= 1, "offload_transfer_piece must be >= 1, not {}", piece_);
  ZRT_CHECK(options_.offload_staging_buffers >= 1 && options_.offload_staging_buffers <= 64,
            "offload_staging_buffers must be 1..64, not {}", options_.offload_staging_buffers);
  const DType cdt = options_.compute_dtype;
  ZRT_CHECK(placement_.size() == plan_.units().size(),
            "optimizer offload: {} unit placements for {} units", placement_.size(),
            plan_.units().size());
  std::int64_t max_shard = 0;
  units_.resize(plan_.units().size());
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = plan_.unit(static_cast<int>(u));
    HostUnit& h = units_[u];
    // Every unit's final gradient reaches gradient_reduced() (for the norm); a unit whose state
    // stays on the device (partial offload) has nothing else here.
    // The events host threads wait on sleep while they wait (EventWait): the engine's thread
    // waits for the sums while the CPU optimizer runs, the CPU optimizer's threads for pieces
    // and staging buffers while the engine's thread needs a core to enqueue the next work.
    h.comm_point = device_.create_event();
    h.norm_ready = device_.create_event(EventWait::kBlock);
    h.d2h_done = device_.create_event(EventWait::kBlock);
    h.params_ready = device_.create_event(EventWait::kBlock);
    if (!placement_[u].stepped_on_host()) continue;
    h.released = device_.create_host_signal();
    h.params_written = device_.create_host_signal();
    const std::string name = fmt::format("unit {}", u);
    // The fp32 state never touches the device.
    h.master = device_.allocate(bytes_of(unit.shard, DType::kFloat32), MemCategory::kMaster,
                                name + " fp32 master", host_space(false));
    if (placement_[u].param_slice == Residence::kHost) {
      h.params = device_.allocate(bytes_of(unit.shard, cdt), MemCategory::kParams,
                                  name + " param slice (offloaded)", host_space(true));
    }
    // A frozen unit keeps its master weights here (a checkpoint saves them) and nothing else: no
    // optimizer state, no gradient, no staging (it is never stepped).
    if (unit.frozen) continue;
    max_shard = std::max(max_shard, unit.shard);
    for (const std::string& state : context.optimizer.spec().state_names) {
      h.state.push_back(device_.allocate(bytes_of(unit.shard, DType::kFloat32),
                                         MemCategory::kOptimizer, name + " " + state,
                                         host_space(false)));
    }
    h.grad = device_.allocate(bytes_of(unit.shard, grad_type_), MemCategory::kGrads,
                              name + " grad slice (offloaded)", host_space(false));
    parallel_fill_zero(h.grad.host<std::byte>(), static_cast<std::size_t>(h.grad.bytes()));
    if (!offload_param_) {
      const std::int64_t pieces = (unit.shard + piece_ - 1) / piece_;
      for (auto& set : h.pieces) {
        for (std::int64_t c = 0; c < pieces; ++c) {
          set.push_back(device_.create_event(EventWait::kBlock));
        }
      }
    }
  }
  copy_ = device_.create_stream("copy");
  gradients_read_ = device_.create_event();
  for (auto& reads_done : reads_done_) reads_done = device_.create_event(EventWait::kBlock);
  cpu_optimizer_ = device_.create_host_stream("cpu-optimizer");
  // (No offloaded unit, offload_optimizer.ratio 0: nothing goes up from here.)
  for (int i = 0; max_shard > 0 && i < options_.offload_staging_buffers; ++i) {
    staging_.push_back(device_.allocate(bytes_of(max_shard, cdt), MemCategory::kWorkspace,
                                        fmt::format("offload staging buffer {}", i),
                                        host_space(false)));
  }
  if (offload_param_) {
    // Where the host accumulates, each reduced slice lands here first (at one micro-batch per
    // step it goes straight into its unit's `grad`).
    if (!reduced_as_is_) {
      host_reduced_ =
          device_.allocate(bytes_of(max_shard, DType::kFloat32), MemCategory::kWorkspace,
                           "offloaded gradient transfer", host_space(false));
    }
  } else {
    const std::int64_t norms_bytes =
        bytes_of(static_cast<std::int64_t>(units_.size()), DType::kFloat32);
    unit_norms_device_ =
        device_.allocate(norms_bytes, MemCategory::kWorkspace, "offloaded gradient norms");
    unit_norms_host_ =
        device_.allocate(norms_bytes, MemCategory::kWorkspace, "offloaded gradient norms (host)",
                         MemorySpace::kPinnedHost);
  }
  forward_order_ = UnitSchedule::forward_order(plan_);
  split_step_ = options_.offload_split_step == OffloadSplitStep::kOn ||
                (options_.offload_split_step == OffloadSplitStep::kAuto &&
                 device_.type() == DeviceType::kCuda);
  if (rank_ == 0) {
    spdlog::info("optimizer offload: the CPU step on {} threads, {}", host_optimizer_->threads(),
                 split_step_ ? "split (the compute-dtype copy first, the state behind the forward)"
                             : "in one pass");
  }
}

CpuOptimizerOffload::~CpuOptimizerOffload() {
  try {
    synchronize();
  } catch (const std::exception& e) {
    spdlog::warn("optimizer offload shut down after a stream error: {}", e.what());
  }
}

void CpuOptimizerOffload::synchronize() {
  drain_each({[this] { cpu_optimizer_->synchronize(); }, [this] { copy_->synchronize(); },
              [this] { rethrow_cpu_step_error(); }});
}

void CpuOptimizerOffload::rethrow_cpu_step_error() const {
  for (const HostUnit& h : units_) {
    if (h.cpu_done.valid() &&
        h.cpu_done.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
      h.cpu_done.get();
  }
}

bool CpuOptimizerOffload::steps_on_host(int u) const {
  // Not a unit the engine steps on the device (partial offload), nor a frozen one.
  return placement_[static_cast<std::size_t>(u)].stepped_on_host() && !plan_.unit(u).frozen;
}

float* CpuOptimizerOffload::state_array(int u, int a) {
  ZRT_CHECK(placement_[static_cast<std::size_t>(u)].stepped_on_host(),
            "state_array({}): the unit's state is on the device (partial offload)", u);
  HostUnit& h = units_[static_cast<std::size_t>(u)];
  ZRT_CHECK(a == 0 || !plan_.unit(u).frozen,
            "state_array({}, {}): a frozen unit holds no optimizer state", u, a);
  return a == 0 ? h.master.host<float>() : h.state[static_cast<std::size_t>(a - 1)].host<float>();
}

void* CpuOptimizerOffload::host_params(int u) {
  HostUnit& h = units_[static_cast<std::size_t>(u)];
  return h.params.empty() ? nullptr : h.params.host<void>();
}

const Event& CpuOptimizerOffload::params_ready(int u) const {
  return *units_[static_cast<std::size_t>(u)].params_ready;
}

void CpuOptimizerOffload::gradient_reduced(int u, DevicePtr<std::byte> reduced, DType type,
                                           bool final, Event* bucket_read) {
  HostUnit& h = units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  ZRT_CHECK(!unit.frozen, "unit {} is frozen: its gradient is never reduced", u);
  const DType adt = options_.grad_accum_dtype;
  if (!offload_param_) {
    // The unit's sum of squares, taken on the device with the kernel the device path's norm runs
    // (on a GPU no host thread reads the whole gradient), on the comm stream where the reduction
    // left the slice: the step's decision needs only the sums, and on the copy stream one unit's
    // sum would queue behind the previous unit's slice going down (GPT-2's 79 MB embedding and
    // the 1.6 MB position embedding reduced right after it: 1.4 ms on the decision's path). A
    // copy down on the comm stream still shares the copy engine with that slice (the same 1.4
    // ms, H100 trace of 30cdfe7), so a kernel stores the sum into pinned host memory.
    ZRT_CHECK(final, "unit {}: the offload takes final gradient slices only here", u);
    TraceSpan norm_span(trace_, comm_, TraceTrack::kComm, "grad norm", "unit", u);
    const DevicePtr<float> norm = unit_norms_device_.device<float>() + u;
    device_.fill_zero(norm.as<std::byte>(), sizeof(float), comm_);
    engine_kernels::add_sum_squares(device_, comm_, reduced, type, unit.shard, norm);
    // By a kernel, not a copy: a copy down would queue behind the previous unit's slice on the
    // copy engine (engine_kernels.h).
    engine_kernels::store_to_pinned_host(device_, comm_, norm, unit_norms_host_.host<float>() + u,
                                         1);
    norm_span.end();
    h.norm_ready->record(comm_);
  }
  // After the sum: whatever frees or rewrites the slice waits for the copy stream, which waits
  // for this point.
  h.comm_point->record(comm_);
  copy_->wait(*h.comm_point);
  if (!placement_[static_cast<std::size_t>(u)].stepped_on_host()) {
    // Partial offload, a unit the device steps: only its sum of squares came down, so the norm
    // adds every unit's in one order whichever side steps it.
    ZRT_CHECK(!offload_param_ && type == adt,
              "unit {} is stepped on the device: a final slice in grad_accum_dtype expected", u);
    h.d2h_done->record(*copy_);
    return;
  }
  // `grad` is the previous step's input to the CPU optimizer until it is done with it. Usually
  // it is long done (the forward needed the unit); otherwise the copy stream waits for the
  // unit's signal, which needs no host thread (a host callback's thread may wait milliseconds for
  // a core while the CPU optimizer's team has them all). A failed CPU step is reported here.
  const std::shared_future<void>& consumed = h.cpu_done;
  if (consumed.valid()) {
    if (consumed.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      consumed.get();
    } else {
      copy_->wait(*h.released, h.released_value);
    }
  }
  if (!offload_param_) {
    ZRT_CHECK(type == grad_type_,
              "offloaded gradient of unit {}: a final slice in {} expected, got {}", u,
              dtype_name(grad_type_), dtype_name(type));
    // The slice goes down in pieces the CPU steps as they land.
    TraceSpan span(trace_, *copy_, TraceTrack::kCopy, "d2h", "unit", u);
    auto& pieces = h.pieces[piece_set_];
    for (std::size_t c = 0; c < pieces.size(); ++c) {
      const std::int64_t begin = static_cast<std::int64_t>(c) * piece_;
      const std::int64_t count = std::min(piece_, unit.shard - begin);
      device_.copy_to_host(h.grad.host<std::byte>() + bytes_of(begin, type),
                           reduced + bytes_of(begin, type),
                           static_cast<std::size_t>(bytes_of(count, type)), *copy_);
      if (c + 1 == pieces.size()) span.end();  // before the CPU may finish with the last piece
      pieces[c]->record(*copy_);
    }
    // The reduction's bucket (offload_takes_reduced_slices) may go once read.
    if (bucket_read != nullptr) bucket_read->record(*copy_);
    h.d2h_done->record(*copy_);
    return;
  }
  // Parameter offload: every micro-batch's reduced slice comes down and is accumulated on the
  // host, so the final gradient exists only there; at one micro-batch per step
  // (offload_takes_reduced_slices) the one slice is the gradient and goes straight into `grad`.
  TraceSpan span(trace_, *copy_, TraceTrack::kCopy, "d2h", "unit", u);
  void* accum = h.grad.host<void>();
  const std::int64_t n = unit.shard;
  if (reduced_as_is_) {
    ZRT_CHECK(type == grad_type_ && final,
              "parameter offload, unit {}: the one reduced slice of a step in {} expected, got "
              "{} (final: {})",
              u, dtype_name(grad_type_), dtype_name(type), final);
    device_.copy_to_host(accum, reduced, static_cast<std::size_t>(bytes_of(n, type)), *copy_);
    if (bucket_read != nullptr) bucket_read->record(*copy_);  // the bucket may go once read
  } else {
    void* staging = host_reduced_.host<void>();
    device_.copy_to_host(staging, reduced, static_cast<std::size_t>(bytes_of(n, type)), *copy_);
    if (bucket_read != nullptr) bucket_read->record(*copy_);  // the bucket may go once read
    copy_->host_callback([staging, type, accum, adt, n] {
      engine_kernels::cpu::accumulate(staging, type, accum, adt, n);
    });
  }
  span.end();
  if (final) {
    // The unit's share of the gradient norm, taken here while the backward of earlier units
    // still runs rather than by the host after the whole backward.
    TraceSpan norm_span(trace_, *copy_, TraceTrack::kCopy, "grad norm", "unit", u);
    const void* grad = h.grad.host<void>();
    double* out = &h.grad_sum_squares;
    const DType grad_type = grad_type_;
    copy_->host_callback(
        [grad, grad_type, n, out] { *out = engine_kernels::cpu::sum_squares(grad, grad_type, n); });
    norm_span.end();
    h.norm_ready->record(*copy_);
    h.d2h_done->record(*copy_);
  }
}

float CpuOptimizerOffload::local_norm_squared(int group) {
  rethrow_cpu_step_error();  // before a decision on gradients of parameters it left half-written
  // Unit by unit in fp64, rounded to fp32 and added in fp32 in unit order: exactly what the device
  // path computes, so offload does not change the clipping decision by a single bit.
  float local = 0.0f;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = plan_.unit(static_cast<int>(u));
    if (unit.group != group || unit.frozen) continue;  // a frozen unit has no gradient
    HostUnit& h = units_[u];
    h.norm_ready->synchronize();  // the unit's sum of squares is on the host
    local +=
        offload_param_ ? static_cast<float>(h.grad_sum_squares) : unit_norms_host_.host<float>()[u];
  }
  gradients_read_->record(*copy_);  // after every unit's copies down
  return local;
}

void CpuOptimizerOffload::wait_for_update(int u, Stream& stream) {
  const HostUnit& h = units_[static_cast<std::size_t>(u)];
  if (h.released_value != 0) stream.wait(*h.params_written, h.released_value);
}

CpuOptimizerOffload::Status CpuOptimizerOffload::status(int u) const {
  const HostUnit& h = units_[static_cast<std::size_t>(u)];
  Status status;
  status.cpu_updated = h.cpu_done.valid() &&
                       h.cpu_done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  status.on_device = status.cpu_updated && (!h.params.empty() || h.params_ready->query());
  return status;
}

std::shared_future<void> CpuOptimizerOffload::run_between_updates(std::function<void()> work) {
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> ready = done->get_future().share();
  // The error goes to the caller's future only: the CPU optimizer's queue never turns sticky,
  // so every step's CPU work runs and raises the signals the copy stream waits for.
  cpu_optimizer_->enqueue([done, work = std::move(work)] {
    try {
      work();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  });
  return ready;
}

void CpuOptimizerOffload::skip_update() {
  for (HostUnit& h : units_) {
    if (h.grad.empty()) continue;  // stepped on the device
    h.d2h_done->synchronize();     // the decision came from the sums, before the slices
    parallel_fill_zero(h.grad.host<std::byte>(), static_cast<std::size_t>(h.grad.bytes()));
  }
  piece_set_ = 1 - piece_set_;
}

void CpuOptimizerOffload::update(std::int64_t step,
                                 const std::vector<std::int64_t>& steps_not_taken, double lr,
                                 double factor,
                                 const std::function<DevicePtr<std::byte>(int u)>& destination) {
  const DType cdt = options_.compute_dtype;
  ZRT_CHECK(steps_not_taken.size() == params_.size(), "{} steps-not-taken for {} parameters",
            steps_not_taken.size(), params_.size());
  // Everything that can throw comes first (the scalars, every slice), before any unit gets a new
  // completion that the copy stream would wait for. A step prepared per distinct own step count
  // (one unless a resume trains parameters that were frozen), the split step's first pass (the
  // same step writing only the compute-dtype copy) beside each.
  rethrow_cpu_step_error();
  std::vector<std::int64_t> not_taken_values;  // index: CpuStepUnit::step_of
  std::vector<HostOptimizer::RangeStep> range_steps, copy_steps;
  const auto step_index = [&](std::int64_t n) {
    const auto at = std::find(not_taken_values.begin(), not_taken_values.end(), n);
    if (at != not_taken_values.end()) {
      return static_cast<std::size_t>(at - not_taken_values.begin());
    }
    not_taken_values.push_back(n);
    range_steps.push_back(host_optimizer_->prepare_step(step - n, lr, factor));
    copy_steps.push_back(split_step_ ? host_optimizer_->prepare_step(step - n, lr, factor,
                                                                     StepWrites::kComputeCopyOnly)
                                     : HostOptimizer::RangeStep{});
    return not_taken_values.size() - 1;
  };
  step_index(0);  // the common case first (and the scalars checked before any unit is touched)
  const std::uint32_t release = ++updates_ == 0 ? ++updates_ : updates_;  // 0 means "never"
  // This step's point on the comm stream after every read of the parameters enqueued before the
  // update (the engine joined its compute stream into comm first): the copies up and the CPU's
  // writes of host parameter slices wait for it. One per step parity, as the pieces.
  const std::unique_ptr<Event>& reads_done = reads_done_[piece_set_];
  const int ring = static_cast<int>(staging_.size());
  std::vector<int> previous_staged(static_cast<std::size_t>(ring), -1);  // each slot's last unit
  int slot_cursor = 0;
  std::vector<CpuStepUnit> work;
  std::vector<int> staged_slot;  // per entry of `work`: its staging slot, or -1 (written directly)
  for (int u : forward_order_) {
    if (!steps_on_host(u)) continue;
    HostUnit& h = units_[static_cast<std::size_t>(u)];
    const Unit& unit = plan_.unit(u);
    CpuStepUnit w;
    w.trace_name = trace_name_ + " unit " + std::to_string(u);
    // Where the CPU writes the updated compute-dtype slice: the host parameter slice (parameter
    // offload), else the next staging buffer, once its previous unit has gone up.
    void* out = nullptr;
    if (!h.params.empty()) {
      out = h.params.host<void>();
      // The engine's gathers copy this slice up on the comm stream: one enqueued before the
      // step (an eval forward's) must have read it before the CPU overwrites it.
      w.slot_free = reads_done.get();
      staged_slot.push_back(-1);
    } else {
      const int slot = slot_cursor++ % ring;
      const int wait_for = previous_staged[static_cast<std::size_t>(slot)];
      previous_staged[static_cast<std::size_t>(slot)] = u;
      out = staging_[static_cast<std::size_t>(slot)].host<void>();
      if (wait_for >= 0)
        w.slot_free = units_[static_cast<std::size_t>(wait_for)].params_ready.get();
      staged_slot.push_back(slot);
    }
    // The unit's slices cut at the pieces its gradient comes down in (without parameter
    // offload; with it the whole gradient is on the host before the decision): the CPU steps
    // piece c once it has landed.
    const auto& piece_events = h.pieces[piece_set_];
    const std::int64_t piece =
        piece_events.empty() ? std::max<std::int64_t>(unit.shard, 1) : piece_;
    // A staging buffer's padding holds its previous unit's bytes: zeroed before the slice goes
    // up whole. (A host parameter slice's padding is zero from assign_state on, and only owned
    // elements are ever written there.)
    const bool staged = h.params.empty();
    const auto zero_padding = [&](std::int64_t begin, std::int64_t end) {
      if (staged && end > begin) {
        w.padding.push_back({static_cast<std::byte*>(out) + bytes_of(begin, cdt),
                             static_cast<std::size_t>(bytes_of(end - begin, cdt))});
      }
    };
    std::int64_t written = 0;  // the slice's elements before it are owned, or padding listed
    for (int p : unit.params) {
      const auto range = plan_.owned_range(p, unit_ranks_[static_cast<std::size_t>(u)]);
      if (range.count > 0) {
        ZRT_CHECK(range.slice_offset >= written,
                  "unit {}: parameter {} starts at element {} of the slice, before the end of "
                  "the one ahead of it ({})",
                  u, p, range.slice_offset, written);
        zero_padding(written, range.slice_offset);
        written = range.slice_offset + range.count;
      }
      for (std::int64_t begin = range.slice_offset, end = range.slice_offset + range.count;
           begin < end;) {
        const std::int64_t c = begin / piece;
        const std::int64_t stop = std::min(end, (c + 1) * piece);
        OptimizerSlice slice;
        slice.param = h.master.host<float>() + begin;
        for (std::size_t k = 0; k < h.state.size(); ++k) {
          slice.state[k] = h.state[k].host<float>() + begin;
        }
        slice.grad = h.grad.host<std::byte>() + bytes_of(begin, grad_type_);
        slice.grad_dtype = grad_type_;
        slice.param_out = static_cast<std::byte*>(out) + bytes_of(begin, cdt);
        slice.out_dtype = cdt;
        slice.numel = stop - begin;
        slice.weight_decay = params_[static_cast<std::size_t>(p)].takes_weight_decay();
        host_optimizer_->validate(slice, w.slices.size());
        w.slices.push_back(slice);
        w.step_of.push_back(step_index(steps_not_taken[static_cast<std::size_t>(p)]));
        w.landed.push_back(piece_events.empty() ? nullptr
                                                : piece_events[static_cast<std::size_t>(c)].get());
        begin = stop;
      }
    }
    zero_padding(written, unit.shard);
    // With parameter offload `grad` accumulates micro-batches and must start from zero once
    // consumed; otherwise (or at one micro-batch per step) the next step's copy overwrites it.
    if (offload_param_ && !reduced_as_is_) {
      void* grad = h.grad.host<void>();
      const std::size_t grad_bytes = static_cast<std::size_t>(h.grad.bytes());
      w.after = [grad, grad_bytes] { std::memset(grad, 0, grad_bytes); };
    }
    w.done = std::make_shared<std::promise<void>>();
    if (split_step_) {
      // The second pass (below) owns the gradient's release and `after`.
      w.released = [signal = h.params_written.get(), release] { signal->raise(release); };
    } else {
      w.released = [params = h.params_written.get(), state = h.released.get(), release] {
        params->raise(release);
        state->raise(release);
      };
    }
    work.push_back(std::move(w));
  }
  // The split step's second pass: every unit again, in the order the next backward's gradients
  // come down (the reverse), writing the fp32 parameters and states but no copy; no waits (its
  // pieces landed in the first pass, which it follows on the same threads).
  std::vector<CpuStepUnit> state_work;
  if (split_step_) {
    for (auto it = work.rbegin(); it != work.rend(); ++it) {
      CpuStepUnit w;
      w.trace_name = it->trace_name + " state";
      w.slices = it->slices;
      w.step_of = it->step_of;
      for (OptimizerSlice& slice : w.slices) slice.param_out = nullptr;
      w.after = std::move(it->after);
      it->after = nullptr;
      w.done = std::make_shared<std::promise<void>>();
      state_work.push_back(std::move(w));
    }
  }
  reads_done->record(comm_);
  copy_->wait(*reads_done);
  // The copy stream carries each staged unit up once the CPU is done with it: it waits for the
  // unit's signal, which the CPU optimizer's thread that finishes the unit raises (or the
  // pipeline on an error: the copy stream never waits forever).
  std::size_t i = 0;
  try {
    for (int u : forward_order_) {
      if (!steps_on_host(u)) continue;
      HostUnit& h = units_[static_cast<std::size_t>(u)];
      if (split_step_) {
        CpuStepUnit& second = state_work[state_work.size() - 1 - i];
        second.released = [signal = h.released.get(), release] { signal->raise(release); };
        h.cpu_done = second.done->get_future().share();
      } else {
        h.cpu_done = work[i].done->get_future().share();
      }
      h.released_value = release;
      const int slot = staged_slot[i++];
      if (slot < 0) continue;
      copy_->wait(*h.params_written, release);
      TraceSpan span(trace_, *copy_, TraceTrack::kCopy, "h2d", "unit", u);
      device_.copy_to_device(destination(u), staging_[static_cast<std::size_t>(slot)].host<void>(),
                             static_cast<std::size_t>(bytes_of(plan_.unit(u).shard, cdt)), *copy_);
      span.end();
      h.params_ready->record(*copy_);
    }
  } catch (...) {
    // No CPU work runs this step: fail every unit's completion and let what waits go on.
    for (auto* pass : {&work, &state_work}) {
      for (CpuStepUnit& w : *pass) {
        w.done->set_exception(std::current_exception());
        if (w.released) w.released();
      }
    }
    throw;
  }
  const int threads = host_optimizer_->threads();
  TraceRecorder* trace = trace_;  // the CPU optimizer's threads record their own spans
  cpu_optimizer_->enqueue([work = std::move(work), state_work = std::move(state_work),
                           range_steps = std::move(range_steps), copy_steps = std::move(copy_steps),
                           threads, trace, name = trace_name_]() mutable {
    const bool split = !state_work.empty();
    try {
      run_cpu_step_pipeline(work, split ? copy_steps : range_steps, threads, trace);
    } catch (const std::exception& e) {
      // Every unit's completion holds the error and every signal is raised; the engine gets the
      // error at its next decision (rethrow_cpu_step_error). The queue stays usable, so later
      // work cannot leave a copy waiting for a signal nobody raises.
      spdlog::error("the CPU optimizer's {} step failed: {}", name, e.what());
      // The first pass of a split step wrote no state: the second does not run.
      for (CpuStepUnit& w : state_work) {
        w.done->set_exception(std::current_exception());
        w.released();
      }
      return;
    }
    if (!split) return;
    try {
      run_cpu_step_pipeline(state_work, range_steps, threads, trace);
    } catch (const std::exception& e) {
      spdlog::error("the CPU optimizer's {} step (its state) failed: {}", name, e.what());
    }
  });
  piece_set_ = 1 - piece_set_;  // the next step's copies record the other set
}

}  // namespace zrt
