// CollectiveSequenceCheck: a debug check that every rank of a group issues the same collectives
// in the same order (comm.check_collective_sequence). A rank that skips a collective, or issues
// another one or another size, makes the others wait for it until the timeout — the hang of a
// mixture-of-experts layer whose expert got no token on one rank. With the check, each operation
// is first agreed on: before the group enqueues it, its ranks all-reduce a running hash of the
// group's sequence so far, on a communicator of their own, from the issuing thread. The hashes
// agree until the first operation that differs; there every rank stops with an Error naming it,
// its position in the sequence and what each rank issued instead, long before any timeout.
//
// Cost: one small blocking all-reduce per operation, at issue time (a host synchronisation in
// the stream-ordered groups): for finding bugs, not for production runs.
//
// Thread-safety: one thread issues a group's operations (process_group.h), so verify() too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <mpi.h>

#include "runtime/common/fnv1a.h"

namespace zrt {

class Watchdog;

class CollectiveSequenceCheck {
 public:
  // `members`: a communicator of the group's ranks in group rank order (duplicated; the caller
  // keeps its own). Collective over those ranks.
  CollectiveSequenceCheck(MPI_Comm members, std::string group, double timeout_s,
                          Watchdog* watchdog);
  ~CollectiveSequenceCheck();
  CollectiveSequenceCheck(const CollectiveSequenceCheck&) = delete;
  CollectiveSequenceCheck& operator=(const CollectiveSequenceCheck&) = delete;

  // Agrees with every member that the next operation is `operation` (its name and every
  // argument that must match across ranks, e.g. "all_gather of 1024 x bf16"). Throws Error naming
  // the first operation that differs; Timeout (after telling the watchdog) when a member does
  // not reach its next operation within the timeout.
  void verify(const std::string& operation);

  // The check of the sub-group MPI_Comm_split(color, key) makes of this group's members.
  // Collective over them.
  std::unique_ptr<CollectiveSequenceCheck> split(int color, int key, std::string group) const;

  std::int64_t verified() const { return verified_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string group_;
  double timeout_s_;
  Watchdog* watchdog_;
  std::uint64_t hash_ = kFnv1aOffsetBasis;
  std::int64_t verified_ = 0;
  // A request given up at a timeout still owns its buffers, so they live here, and the
  // communicator is not freed under it.
  std::uint64_t send_[2] = {0, 0};
  std::uint64_t recv_[2] = {0, 0};
  bool abandoned_ = false;
};

}  // namespace zrt
