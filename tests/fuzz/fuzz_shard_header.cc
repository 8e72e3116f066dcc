// libFuzzer target for the llm.c shard header parser (clang only; see tests/CMakeLists.txt):
//   build/tests/fuzz_shard_header -max_len=4096 [corpus_dir]
// Every input is parsed against its own size and against the size its header's count implies
// (so the accepting path is reached too); the result must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "runtime/data/token_shard.h"

namespace {

void check(const std::uint8_t* data, std::size_t size, std::uint64_t file_size) {
  const zrt::ShardHeader h = zrt::parse_shard_header(data, size, file_size);
  if (h.ok() != h.error.empty()) __builtin_trap();
  if (h.ok() && (size < zrt::kShardHeaderBytes || h.num_tokens < 0 ||
                 file_size != zrt::shard_file_bytes(h.num_tokens, h.token_bytes))) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check(data, size, size);
  if (size >= 12) {
    std::int32_t count;
    std::memcpy(&count, data + 8, sizeof(count));
    if (count >= 0) check(data, size, zrt::shard_file_bytes(count));
    if (count >= 0) check(data, size, zrt::shard_file_bytes(count, 4));
  }
  return 0;
}
