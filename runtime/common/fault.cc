#include "runtime/common/fault.h"

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>

#include <mpi.h>
#include <spdlog/spdlog.h>

#include "runtime/common/error.h"

namespace zrt {

namespace {

constexpr const char* kVariable = "ZRT_FAULT_INJECT";

std::int64_t parse_number(std::string_view spec, std::string_view key, std::string_view value) {
  std::int64_t n = 0;
  bool ok = !value.empty();
  for (const char c : value) {
    if (c < '0' || c > '9' || n > (INT64_MAX - 9) / 10) {
      ok = false;
      break;
    }
    n = n * 10 + (c - '0');
  }
  if (!ok) {
    ZRT_THROW(InvalidArgument, "{}='{}': {} must be a non-negative integer, not '{}'", kVariable,
              spec, key, value);
  }
  return n;
}

FaultSpec parse_one(std::string_view spec) {
  FaultSpec f;
  std::size_t start = 0;
  bool first = true;
  while (start <= spec.size()) {
    std::size_t end = spec.find(':', start);
    if (end == std::string_view::npos) end = spec.size();
    const std::string_view field = spec.substr(start, end - start);
    start = end + 1;
    if (first) {
      first = false;
      if (field == "sigkill") {
        f.action = FaultAction::kSigkill;
      } else if (field == "sigstop") {
        f.action = FaultAction::kSigstop;
      } else if (field == "sigterm") {
        f.action = FaultAction::kSigterm;
      } else if (field == "sigusr1") {
        f.action = FaultAction::kSigusr1;
      } else if (field == "throw") {
        f.action = FaultAction::kThrow;
      } else if (field == "nan") {
        f.action = FaultAction::kNan;
      } else {
        ZRT_THROW(InvalidArgument,
                  "{}='{}': unknown fault '{}'; expected sigkill, sigstop, sigterm, sigusr1, "
                  "throw or nan",
                  kVariable, spec, field);
      }
      continue;
    }
    const std::size_t eq = field.find('=');
    const std::string_view key = field.substr(0, eq);
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view() : field.substr(eq + 1);
    if (eq == std::string_view::npos || value.empty()) {
      ZRT_THROW(InvalidArgument, "{}='{}': expected key=value, got '{}'", kVariable, spec, field);
    }
    if (key == "point") {
      f.point = std::string(value);
    } else if (key == "rank") {
      f.rank = static_cast<int>(std::min<std::int64_t>(parse_number(spec, key, value), INT32_MAX));
    } else if (key == "step") {
      f.step = parse_number(spec, key, value);
    } else {
      ZRT_THROW(InvalidArgument, "{}='{}': unknown field '{}'; expected point, rank or step",
                kVariable, spec, key);
    }
  }
  return f;
}

const char* action_name(FaultAction a) {
  switch (a) {
    case FaultAction::kSigkill:
      return "sigkill";
    case FaultAction::kSigstop:
      return "sigstop";
    case FaultAction::kSigterm:
      return "sigterm";
    case FaultAction::kSigusr1:
      return "sigusr1";
    case FaultAction::kThrow:
      return "throw";
    case FaultAction::kNan:
      return "nan";
    case FaultAction::kNone:
      break;
  }
  return "none";
}

int world_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

std::vector<FaultSpec> parse_fault_specs(std::string_view text) {
  std::vector<FaultSpec> specs;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) specs.push_back(parse_one(text.substr(start, end - start)));
    start = end + 1;
  }
  return specs;
}

FaultAction fault_point(std::string_view point, std::int64_t step, int rank) {
  const char* env = std::getenv(kVariable);
  if (env == nullptr || *env == '\0') return FaultAction::kNone;
  if (rank < 0) rank = world_rank();
  for (const FaultSpec& f : parse_fault_specs(env)) {
    if (f.point != point || (f.rank >= 0 && f.rank != rank) || (f.step >= 0 && f.step != step)) {
      continue;
    }
    spdlog::warn("fault injected: {} at {} (rank {}, step {})", action_name(f.action), point, rank,
                 step);
    spdlog::default_logger()->flush();
    switch (f.action) {
      case FaultAction::kSigkill:
        std::raise(SIGKILL);
        break;
      case FaultAction::kSigstop:
        // Stops every thread of the process; it resumes (returning here) only on SIGCONT.
        std::raise(SIGSTOP);
        break;
      case FaultAction::kSigterm:
        std::raise(SIGTERM);  // the program's handler decides (zrt-train: a preemption)
        break;
      case FaultAction::kSigusr1:
        std::raise(SIGUSR1);
        break;
      case FaultAction::kThrow:
        ZRT_THROW(Error, "fault injected at {} (rank {}, step {})", point, rank, step);
      case FaultAction::kNan:
      case FaultAction::kNone:
        break;
    }
    return f.action;
  }
  return FaultAction::kNone;
}

}  // namespace zrt
