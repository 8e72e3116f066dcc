// Which of its two algorithms the CPU attention (attention.h, and gqa_attention.h through it)
// runs for a call, and what forces one.
//
//   kFull:  today's kernel: per (b,h) pair, each document's L x L scores at once, then two
//           single-threaded GEMMs (attention.cc). Fastest for short sequences; its workspace holds
//           the scores of up to kAttentionPairGroup pairs, min(32, B*NH) * T^2 elements in the
//           forward and twice that in the backward: 3 GiB of fp32 at T = 10K and 4 heads.
//   kTiled: flash-style (tiled_attention.h): query tiles against key tiles with an online
//           softmax, so only a few tiles' scores exist at a time; its workspace does not grow with
//           T^2 (the backward's one extra array is the (B,NH,T) row term D).
//   kAuto:  the environment variable ZRT_CPU_ATTENTION ("full", "tiled", or "auto"/unset), and
//           for "auto" kTiled exactly when the full kernel's backward scores, 2 * min(32, B*NH) *
//           T^2 elements of the compute type, would exceed kAttentionTiledAboveBytes.
//
// The forward and the backward of one call resolve the same way (the rule sees B, T, NH and the
// compute type only), so a backward always runs on the algorithm of its forward; the workspace
// functions resolve the same way too, so they return what the chosen path uses.
//
// Thread-safety: the resolver reads the environment on every call (so a test can switch paths
// between calls); call it while no other thread changes the environment.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrt::kernels::cpu {

enum class AttentionPath { kAuto, kFull, kTiled };

// Above this many bytes of full-kernel backward scores the tiled kernel runs (kAuto). 16 MiB is
// where the (T,T) matrices stop fitting any cache and their workspace starts to rival the
// activations long-sequence runs tile (an fp32 run with 4 heads switches above T = 724, one with
// 32 pairs above T = 256); every test and benchmark shape before the long-sequence work stays
// below it.
constexpr std::int64_t kAttentionTiledAboveBytes = std::int64_t{16} << 20;

const char* attention_path_name(AttentionPath path);  // "auto", "full", "tiled"

// Bytes the full kernel's backward keeps for scores: 2 * min(kAttentionPairGroup, B*NH) * T^2 *
// acc_bytes (acc_bytes: sizeof the compute type).
std::int64_t attention_full_scores_bytes(int B, int T, int NH, std::size_t acc_bytes);

// kFull or kTiled for `requested` (never kAuto): requested itself unless it is kAuto, else
// ZRT_CPU_ATTENTION, else the threshold rule above. Throws InvalidArgument, naming the variable,
// for a value other than "auto", "full" or "tiled".
AttentionPath resolve_attention_path(AttentionPath requested, int B, int T, int NH,
                                     std::size_t acc_bytes);

}  // namespace zrt::kernels::cpu
