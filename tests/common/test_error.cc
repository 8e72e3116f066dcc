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

}  // namespace
}  // namespace zrt
