#include "models/moe/expert_dispatch.h"

#include <algorithm>

#include "runtime/common/error.h"

namespace zrt::moe {

void ExpertPartition::check() const {
  ZRT_CHECK(ep_size >= 1 && num_experts >= 1 && num_experts % ep_size == 0,
            "expert_parallel.autoep_size {} does not divide the layer's {} experts: each rank of "
            "the expert-parallel group holds the same number of experts; give a divisor of {}",
            ep_size, num_experts, num_experts);
  ZRT_CHECK(ep_rank >= 0 && ep_rank < ep_size, "expert-parallel rank {} outside a group of {}",
            ep_rank, ep_size);
}

ExpertDispatch::ExpertDispatch(Device& device, Stream& compute, ProcessGroup& group,
                               int num_experts)
    : device_(device),
      compute_(compute),
      group_(group),
      experts_{num_experts, group.size(), group.rank()},
      compute_done_(device.create_event()),
      comm_done_(device.create_event()) {
  experts_.check();
  const std::int64_t bytes = own_bytes(num_experts) / 2;
  counts_out_ = device.allocate(bytes, MemCategory::kComm, "expert dispatch counts (out)");
  counts_in_ = device.allocate(bytes, MemCategory::kComm, "expert dispatch counts (in)");
}

void ExpertDispatch::comm_after_compute() {
  compute_done_->record(compute_);
  group_.stream().wait(*compute_done_);
}

void ExpertDispatch::compute_after_comm() {
  comm_done_->record(group_.stream());
  compute_.wait(*comm_done_);
}

DispatchPlan ExpertDispatch::plan(const std::vector<std::int64_t>& counts) {
  const int E = experts_.num_experts, L = experts_.local(), ep = experts_.ep_size;
  ZRT_CHECK(static_cast<int>(counts.size()) == E,
            "expert dispatch: {} counts for a layer of {} experts", counts.size(), E);
  DispatchPlan plan;
  plan.experts = experts_;
  plan.counts = counts;
  for (const std::int64_t c : counts) {
    ZRT_CHECK(c >= 0, "expert dispatch: a negative row count {}", c);
    plan.rows += c;
  }
  // Block p of the exchange: this rank's counts for rank p's experts, which are counts[p*L ..]
  // already; what comes back, block s: source s's counts for this rank's experts.
  Stream& comm = group_.stream();
  // The copies below read `counts` and write `plan` on the stream (the CPU backend's worker): a
  // failed exchange must not free them under that work.
  DrainOnUnwind drain(comm);
  comm_after_compute();  // the buffers' previous exchange was read on the host already
  device_.copy_to_device(counts_out_.device<std::byte>(), counts.data(),
                         static_cast<std::size_t>(E) * 8, comm);
  group_.all_to_all(counts_out_.device<std::byte>(), counts_in_.device<std::byte>(), L,
                    DType::kInt64);
  plan.from_sources.assign(static_cast<std::size_t>(E), 0);
  device_.copy_to_host(plan.from_sources.data(), counts_in_.device<std::byte>(),
                       static_cast<std::size_t>(E) * 8, comm);
  comm.synchronize();

  plan.local_counts.assign(static_cast<std::size_t>(L), 0);
  std::vector<std::int64_t> send(static_cast<std::size_t>(ep), 0), recv = send;
  for (int s = 0; s < ep; ++s) {
    for (int l = 0; l < L; ++l) {
      const auto i = static_cast<std::size_t>(s * L + l);
      ZRT_CHECK(plan.from_sources[i] >= 0, "expert dispatch: rank {} sends {} rows", s,
                plan.from_sources[i]);
      recv[static_cast<std::size_t>(s)] += plan.from_sources[i];
      plan.local_counts[static_cast<std::size_t>(l)] += plan.from_sources[i];
      send[static_cast<std::size_t>(s)] += counts[i];  // rank s's experts are s*L .. s*L+L-1
    }
  }
  for (const std::int64_t c : plan.local_counts) plan.local_rows += c;
  plan.to_experts = AllToAllvLayout::packed(send, recv);
  plan.to_owners = AllToAllvLayout::packed(recv, send);
  return plan;
}

DevicePtr<std::byte> ExpertDispatch::staging(std::int64_t bytes) {
  const std::int64_t need = std::max<std::int64_t>(bytes, 1);
  if (staging_.empty() || staging_.bytes() < need) {
    // The old staging may still be read or written by either stream.
    compute_.synchronize();
    group_.stream().synchronize();
    staging_.reset();
    staging_ = device_.allocate(std::max(need, 2 * staging_.bytes()), MemCategory::kActivations,
                                "expert dispatch staging");
  }
  return staging_.device<std::byte>();
}

void ExpertDispatch::reorder(const DispatchPlan& plan, DevicePtr<const std::byte> from,
                             DevicePtr<std::byte> to, std::int64_t row_bytes, bool to_local) {
  const int L = plan.experts.local(), ep = plan.experts.ep_size;
  // Where each expert's rows start expert-major, as the sources' blocks are met source-major.
  std::vector<std::int64_t> expert_at(static_cast<std::size_t>(L), 0);
  for (int l = 1; l < L; ++l) {
    const auto i = static_cast<std::size_t>(l);
    expert_at[i] = expert_at[i - 1] + plan.local_counts[i - 1];
  }
  std::int64_t source_at = 0;
  for (int s = 0; s < ep; ++s) {
    for (int l = 0; l < L; ++l) {
      const std::int64_t n = plan.from_sources[static_cast<std::size_t>(s * L + l)];
      const std::int64_t expert_row = expert_at[static_cast<std::size_t>(l)];
      if (n > 0) {
        const std::int64_t src_row = to_local ? source_at : expert_row;
        const std::int64_t dst_row = to_local ? expert_row : source_at;
        device_.copy(to + dst_row * row_bytes, from + src_row * row_bytes,
                     static_cast<std::size_t>(n * row_bytes), compute_);
      }
      expert_at[static_cast<std::size_t>(l)] += n;
      source_at += n;
    }
  }
}

namespace {

// A plan's layout (rows) in elements of a row of `width`.
AllToAllvLayout in_elements(AllToAllvLayout layout, std::int64_t width) {
  for (auto* v :
       {&layout.send_counts, &layout.send_offsets, &layout.recv_counts, &layout.recv_offsets}) {
    for (std::int64_t& x : *v) x *= width;
  }
  return layout;
}

}  // namespace

std::int64_t ExpertDispatch::own_bytes(int num_experts) {
  return 2 * static_cast<std::int64_t>(num_experts) * 8;
}

void ExpertDispatch::dispatch(const DispatchPlan& plan, DevicePtr<const std::byte> rows,
                              DevicePtr<std::byte> local, std::int64_t width, DType dtype,
                              DevicePtr<std::byte> given_staging) {
  const std::int64_t row_bytes = width * static_cast<std::int64_t>(dtype_size(dtype));
  const DevicePtr<std::byte> staged =
      given_staging ? given_staging : staging(plan.local_rows * row_bytes);
  comm_after_compute();
  group_.all_to_allv(rows, staged, in_elements(plan.to_experts, width), dtype);
  compute_after_comm();
  reorder(plan, staged, local, row_bytes, /*to_local=*/true);
}

void ExpertDispatch::combine(const DispatchPlan& plan, DevicePtr<const std::byte> local,
                             DevicePtr<std::byte> rows, std::int64_t width, DType dtype,
                             DevicePtr<std::byte> given_staging) {
  const std::int64_t row_bytes = width * static_cast<std::int64_t>(dtype_size(dtype));
  const DevicePtr<std::byte> staged =
      given_staging ? given_staging : staging(plan.local_rows * row_bytes);
  reorder(plan, local, staged, row_bytes, /*to_local=*/false);
  comm_after_compute();
  group_.all_to_allv(staged, rows, in_elements(plan.to_owners, width), dtype);
  compute_after_comm();
}

}  // namespace zrt::moe
