// Fault injection for tests: named fault points that do nothing unless the environment
// variable ZRT_FAULT_INJECT asks for a fault there.
//
//   ZRT_FAULT_INJECT="ACTION[:point=NAME][:rank=R][:step=S][,ACTION...]"
//
// ACTION is one of
//   sigkill  the process sends itself SIGKILL (a rank that dies)
//   sigstop  the process sends itself SIGSTOP (a rank that freezes; mpirun cannot notice)
//   sigterm  the process sends itself SIGTERM and goes on (zrt-train: a preemption)
//   sigusr1  the process sends itself SIGUSR1 and goes on (zrt-train: a preemption)
//   throw    fault_point throws zrt::Error (a rank that fails cleanly)
//   nan      fault_point returns FaultAction::kNan; the caller corrupts its data with a NaN
// point defaults to "train.step"; without rank or step the fault fires on every rank or step.
// Example: ZRT_FAULT_INJECT=sigstop:rank=2:step=3 freezes rank 2 in the middle of step 3.
//
// Fault points (docs/reliability.md keeps the list):
//   train.step        zrt-train, every step, before the last micro-batch's forward/backward
//                     (the step's first micro-batches are done; their reductions may be in flight)
//   train.start       zrt-train, once, before the process groups are created (step -1)
//   checkpoint.write  every save, on every rank, before the rank writes its file (step: the
//                     checkpoint's step; on the async writer thread for async saves)
// New points are one call: fault_point("checkpoint.write", step) where the fault should hit.
//
// The variable is read at each call (no cached state); a malformed value throws
// InvalidArgument naming it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zrt {

enum class FaultAction { kNone, kSigkill, kSigstop, kSigterm, kSigusr1, kThrow, kNan };

struct FaultSpec {
  FaultAction action = FaultAction::kNone;
  std::string point = "train.step";
  int rank = -1;           // -1: every rank
  std::int64_t step = -1;  // -1: every step
};

// Parses a ZRT_FAULT_INJECT value (empty: no faults). Throws InvalidArgument on bad syntax.
std::vector<FaultSpec> parse_fault_specs(std::string_view text);

// The fault configured for (point, rank, step), if any: signals and throws are carried out
// here (logged first); kNan is returned for the caller to apply; kNone almost always.
// rank < 0 takes this process's rank in MPI_COMM_WORLD (0 before MPI is initialised).
FaultAction fault_point(std::string_view point, std::int64_t step = -1, int rank = -1);

}  // namespace zrt
