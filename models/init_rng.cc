#include "models/init_rng.h"

namespace zrt {

void fill_counter_normal(std::uint64_t seed, std::uint64_t stream, std::int64_t begin,
                         std::int64_t count, double scale, float* out) {
  // Below ~64K values a thread team costs more than it saves.
#pragma omp parallel for schedule(static) if (count >= (std::int64_t{1} << 16))
  for (std::int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<float>(
        scale * counter_normal(seed, stream, static_cast<std::uint64_t>(begin + i)));
  }
}

}  // namespace zrt
