// libFuzzer target for the safetensors reader: any byte string must either load (and then
// every tensor reads back with the element count its shape promises) or throw
// zrt::InvalidArgument; any other exception, a crash or a sanitizer report is a bug. Built with
// -DZRT_FUZZ=ON.
//   build-fuzz/tests/fuzz/fuzz_safetensors tests/fuzz/corpus/safetensors -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/safetensors.h"
#include "runtime/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const zrt::SafetensorsFile file = zrt::SafetensorsFile::from_bytes(bytes, "fuzz.safetensors");
    for (const auto& [name, entry] : file.tensors()) {
      std::uint64_t count = 1;
      for (const std::int64_t d : entry.shape) count *= static_cast<std::uint64_t>(d);
      if (entry.end > size || entry.begin > entry.end) __builtin_trap();
      if (file.read_f32(name).size() != count) __builtin_trap();
    }
  } catch (const zrt::InvalidArgument&) {
  }
  return 0;
}
