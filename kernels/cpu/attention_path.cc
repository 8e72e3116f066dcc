#include "kernels/cpu/attention_path.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cpu/attention.h"
#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

const char* attention_path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::kFull:
      return "full";
    case AttentionPath::kTiled:
      return "tiled";
    default:
      return "auto";
  }
}

std::int64_t attention_full_scores_bytes(int B, int T, int NH, std::size_t acc_bytes) {
  const std::int64_t pairs = std::min<std::int64_t>(kAttentionPairGroup, std::int64_t{B} * NH);
  return 2 * pairs * T * T * static_cast<std::int64_t>(acc_bytes);
}

AttentionPath resolve_attention_path(AttentionPath requested, int B, int T, int NH,
                                     std::size_t acc_bytes) {
  if (requested != AttentionPath::kAuto) return requested;
  const char* env = std::getenv("ZRT_CPU_ATTENTION");
  const std::string value = env == nullptr ? "" : env;
  if (value == "full") return AttentionPath::kFull;
  if (value == "tiled") return AttentionPath::kTiled;
  if (!value.empty() && value != "auto") {
    ZRT_THROW(InvalidArgument, "ZRT_CPU_ATTENTION={}: expected auto, full or tiled", value);
  }
  return attention_full_scores_bytes(B, T, NH, acc_bytes) > kAttentionTiledAboveBytes
             ? AttentionPath::kTiled
             : AttentionPath::kFull;
}

}  // namespace zrt::kernels::cpu
