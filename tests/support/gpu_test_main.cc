// Catch2 entry point for single-process GPU tests. Listing (--list-tests,
// --list-test-names-only, --list-tags, --help) works on any machine; running tests without a
// usable CUDA device prints "SKIPPED: no CUDA device (...)" and exits with kSkipExitCode.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "runtime/common/log.h"
#include "tests/support/gpu_test_support.h"

namespace {
bool only_lists(const Catch::ConfigData& c) {
  return c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.showHelp;
}
}  // namespace

int main(int argc, char** argv) {
  zrt::init_logging(0);
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (!only_lists(session.configData())) {
    if (const std::string why = zrt::test::no_gpu_reason(); !why.empty()) {
      std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
      return zrt::test::kSkipExitCode;
    }
    zrt::test::set_gpu_index(0);
  }
  return session.run();
}
