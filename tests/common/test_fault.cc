// Fault injection (runtime/common/fault.h): the ZRT_FAULT_INJECT grammar, matching by point,
// rank and step, and clear errors for malformed values. (The signals themselves are exercised
// by the fault_sig*_np4 tests; here only throw and nan fire.)
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdlib>

#include "runtime/common/error.h"
#include "runtime/common/fault.h"

using namespace zrt;

TEST_CASE("ZRT_FAULT_INJECT parses into fault specs") {
  CHECK(parse_fault_specs("").empty());
  const auto specs = parse_fault_specs("sigstop:rank=2:step=3,nan:point=train.grad,throw");
  REQUIRE(specs.size() == 3);
  CHECK(specs[0].action == FaultAction::kSigstop);
  CHECK(specs[0].point == "train.step");
  CHECK(specs[0].rank == 2);
  CHECK(specs[0].step == 3);
  CHECK(specs[1].action == FaultAction::kNan);
  CHECK(specs[1].point == "train.grad");
  CHECK(specs[1].rank == -1);
  CHECK(specs[1].step == -1);
  CHECK(specs[2].action == FaultAction::kThrow);
}

TEST_CASE("malformed ZRT_FAULT_INJECT values are errors naming the problem") {
  CHECK_THROWS_WITH(parse_fault_specs("sighup"),
                    Catch::Contains("ZRT_FAULT_INJECT='sighup': unknown fault 'sighup'; "
                                    "expected sigkill, sigstop, sigterm, sigusr1, throw or nan"));
  CHECK_THROWS_WITH(parse_fault_specs("nan:rank=two"),
                    Catch::Contains("rank must be a non-negative integer, not 'two'"));
  CHECK_THROWS_WITH(parse_fault_specs("nan:rank"),
                    Catch::Contains("expected key=value, got 'rank'"));
  CHECK_THROWS_WITH(parse_fault_specs("nan:when=3"),
                    Catch::Contains("unknown field 'when'; expected point, rank or step"));
  CHECK_THROWS_AS(parse_fault_specs("nan:step=-1"), InvalidArgument);
}

TEST_CASE("fault points fire only at their point, rank and step") {
  unsetenv("ZRT_FAULT_INJECT");
  CHECK(fault_point("train.step", 3, 2) == FaultAction::kNone);
  setenv("ZRT_FAULT_INJECT", "nan:rank=2:step=3,throw:point=checkpoint.write:step=5", 1);
  CHECK(fault_point("train.step", 3, 2) == FaultAction::kNan);
  CHECK(fault_point("train.step", 3, 1) == FaultAction::kNone);
  CHECK(fault_point("train.step", 4, 2) == FaultAction::kNone);
  CHECK(fault_point("checkpoint.write", 3, 2) == FaultAction::kNone);
  CHECK(fault_point("checkpoint.write", 4, 0) == FaultAction::kNone);
  CHECK_THROWS_WITH(fault_point("checkpoint.write", 5, 0),
                    Catch::Contains("fault injected at checkpoint.write (rank 0, step 5)"));
  unsetenv("ZRT_FAULT_INJECT");
}

namespace {
volatile std::sig_atomic_t g_seen = 0;
void remember(int signal) {
  g_seen = signal;
}
}  // namespace

TEST_CASE("sigterm and sigusr1 faults raise the signal and return to the caller") {
  const auto specs = parse_fault_specs("sigterm:step=3,sigusr1:point=checkpoint.write:rank=1");
  REQUIRE(specs.size() == 2);
  CHECK(specs[0].action == FaultAction::kSigterm);
  CHECK(specs[1].action == FaultAction::kSigusr1);
  CHECK(specs[1].point == "checkpoint.write");
  // With a handler installed (as zrt-train's), the process survives and the handler ran.
  struct sigaction action {
  }, old_term{}, old_usr1{};
  action.sa_handler = remember;
  sigaction(SIGTERM, &action, &old_term);
  sigaction(SIGUSR1, &action, &old_usr1);
  setenv("ZRT_FAULT_INJECT", "sigterm:step=3,sigusr1:point=checkpoint.write:rank=1", 1);
  CHECK(fault_point("train.step", 2, 0) == FaultAction::kNone);
  CHECK(g_seen == 0);
  CHECK(fault_point("train.step", 3, 0) == FaultAction::kSigterm);
  CHECK(g_seen == SIGTERM);
  CHECK(fault_point("checkpoint.write", 7, 0) == FaultAction::kNone);
  CHECK(fault_point("checkpoint.write", 7, 1) == FaultAction::kSigusr1);
  CHECK(g_seen == SIGUSR1);
  unsetenv("ZRT_FAULT_INJECT");
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGUSR1, &old_usr1, nullptr);
}
