// Quantized collectives (ZeRO++): int8 codes and an fp32 scale per block on the wire
// (quantize.h), full precision at both ends.
//
// - all_gather (qwZ): each rank quantizes its slice, the group all-gathers codes + scales, every
//   rank dequantizes all slices into the output dtype. Error per element: quantize.h's bound.
// - reduce_scatter (qgZ), hierarchical over L ranks per node and M nodes (world rank
//   = node * L + local rank): (1) each rank quantizes every destination slice and an all-to-all
//   inside the node gives local rank l the node's contributions to the M slices owned by local
//   rank l of every node; those are dequantized and summed in fp32 in local-rank order, (2)
//   re-quantized, exchanged by an all-to-all between the nodes' local ranks l, dequantized and
//   summed in fp32 in node order, then rounded to the output dtype (divided by N for avg). Only
//   int8 + scales cross node boundaries, and each rank sends 1/L of the data over them that a
//   flat reduce-scatter would. With one node (M = 1) step 2 is skipped; with one rank per node
//   (L = 1) step 1 is.
//
// Wire format of one slice of n elements: its codes padded to a multiple of 4 bytes, then its
// quantized_block_count(n, block) scales, as 32-bit words (moved as kInt32, never reduced), so
// the bytes counted by the groups' counters are exactly what travels.
//
// Stream-ordered and asynchronous like every collective: the groups must all issue on one stream,
// and the quantize / dequantize kernels run on it too (CPU twins enqueued on the CPU stream,
// CUDA kernels on the CUDA stream). Scratch buffers are kept and grown on demand (growing
// synchronizes the stream first). Not thread-safe; drive it from the stream's owner.
#pragma once

#include <cstdint>

#include "runtime/comm/process_group.h"

namespace zrt {

// 32-bit words of one quantized slice of n elements in blocks of `block`.
constexpr std::int64_t quantized_slice_words(std::int64_t n, std::int64_t block) {
  return (n + 3) / 4 + (n + block - 1) / block;
}

class QuantizedCollectives {
 public:
  static constexpr std::int64_t kDefaultBlock = 2048;  // elements per fp32 scale

  // world: the group reduced and gathered over. intra / inter: its intra-node and inter-node
  // sub-groups (make_subgroup with intra_node_plan / inter_node_plan), or both null to treat the
  // world as one node. All on `world`'s stream; they must outlive this object.
  QuantizedCollectives(Device& device, ProcessGroup& world, ProcessGroup* intra,
                       ProcessGroup* inter, std::int64_t block = kDefaultBlock);
  ~QuantizedCollectives();
  QuantizedCollectives(const QuantizedCollectives&) = delete;
  QuantizedCollectives& operator=(const QuantizedCollectives&) = delete;

  std::int64_t block() const { return block_; }

  // out[r*count .. (r+1)*count) = dequantized `in` of rank r, in dtype (fp32, bf16, fp16).
  // in and out must not overlap.
  void all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                  DType dtype);
  // out (count elements of dtype) = sum (kSum) or mean (kAvg) over ranks of
  // in[rank*count .. (rank+1)*count), summed in fp32 from quantized values as described above.
  void reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out, std::int64_t count,
                      DType dtype, ReduceOp op);

 private:
  // Scratch `which` of at least `bytes`.
  std::byte* scratch(int which, std::int64_t bytes);
  // Kernels on the stream: codes + scales of n elements of dtype at in into the slice at dst.
  void quantize(const std::byte* in, DType dtype, std::int64_t n, std::byte* dst);
  void dequantize(const std::byte* src, std::int64_t n, DType dtype, std::byte* out);
  void dequantize_add(const std::byte* src, std::int64_t n, float* acc, bool add);
  void narrow(const float* acc, std::int64_t n, float divisor, DType dtype, std::byte* out);

  Device& device_;
  ProcessGroup& world_;
  ProcessGroup* intra_;
  ProcessGroup* inter_;
  std::int64_t block_;
  int ranks_per_node_;
  int nodes_;
  Buffer scratch_[4];
};

}  // namespace zrt
