// Catch2 entry point for single-process tests: logging at warn so failures stay readable.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "runtime/common/log.h"

int main(int argc, char** argv) {
  zrt::init_logging(0);
  return Catch::Session().run(argc, argv);
}
