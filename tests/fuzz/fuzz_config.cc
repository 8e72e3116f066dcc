// libFuzzer target for the config parser (strict JSON reader + validation against the key
// table): any input must either give a Config or throw zrt::Error (InvalidArgument) with a
// message; any other exception, a crash or a sanitizer report is a bug. Built with -DZRT_FUZZ=ON.
//   build-fuzz/tests/fuzz/fuzz_config tests/fuzz/corpus/config -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"
#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);  // warnings about accepted keys would flood the run
    return true;
  }();
  (void)quiet;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The world size changes which batch configs are valid: take it from the input's length.
  const int world = 1 + static_cast<int>(size % 4);
  try {
    const zrt::Config config = zrt::parse_config_text(text, world, "fuzz.json");
    // What validation promises about an accepted config.
    if (config.batch.micro_batch_size < 1 || config.engine.gradient_accumulation_steps < 1 ||
        config.batch.train_batch_size !=
            config.batch.micro_batch_size * config.engine.gradient_accumulation_steps * world ||
        config.engine.stage < 0 || config.engine.stage > 3 || !(config.comm.timeout_s > 0)) {
      __builtin_trap();
    }
  } catch (const zrt::Error& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
