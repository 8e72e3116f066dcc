// Errors carry "file:line: message" with the file relative to the source tree, whatever the
// checkout's path (runtime/common/error.h).
#include <catch2/catch.hpp>

#include <string>

#include "runtime/common/error.h"

namespace zrt {
namespace {

TEST_CASE("an error's source path is relative to the source tree") {
  const auto where = [](const char* file) { return std::string(Error(file, 7, "m").what()); };
  CHECK(where("/home/u/zrt/runtime/comm/x.cc") == "runtime/comm/x.cc:7: m");
  CHECK(where("/home/u/zrt/config/config.cc") == "config/config.cc:7: m");
  CHECK(where("/home/u/zrt/train/training_run.cc") == "train/training_run.cc:7: m");
  CHECK(where("/home/u/zrt/tests/train/test_train.cc") == "tests/train/test_train.cc:7: m");
  CHECK(where("/home/u/zrt/tests/config/test_config.cc") == "tests/config/test_config.cc:7: m");
  CHECK(where("elsewhere.cc") == "elsewhere.cc:7: m");
}

TEST_CASE("a tool's error text: the message for the user's errors, the location for a bug") {
  const InvalidArgument user("/home/u/zrt/config/config.cc", 7, "seq_len: 0 is out of range");
  CHECK(error_text(user) == "seq_len: 0 is out of range");
  const Error io("/home/u/zrt/runtime/data/token_shard.cc", 102, "x.bin: write failed: ENOSPC");
  CHECK(error_text(io) == "x.bin: write failed: ENOSPC");
  // ZRT_CHECK throws an InternalError (still an Error): its location stays.
  try {
    const int units = 0;
    ZRT_CHECK(units > 0, "{} units", units);
    FAIL("ZRT_CHECK did not throw");
  } catch (const Error& e) {
    CHECK(dynamic_cast<const InternalError*>(&e) != nullptr);
    CHECK_THAT(error_text(e), Catch::StartsWith("tests/common/test_error.cc:"));
    CHECK_THAT(error_text(e), Catch::EndsWith(": check failed: units > 0: 0 units"));
  }
  CHECK(error_text(std::runtime_error("plain")) == "plain");
}

}  // namespace
}  // namespace zrt
