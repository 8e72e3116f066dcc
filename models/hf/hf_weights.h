// The weights of a Hugging Face model: one model.safetensors, or the shards a
// model.safetensors.index.json lists ({"metadata": {"total_size": N}, "weight_map": {tensor:
// file}}), read as one set of named tensors; and the writer of the same layout.
//
// The index is checked against the shards before any tensor is read: every file it names must
// be a plain file name in the same directory and a valid safetensors file, every tensor it maps
// must be in the file it names, every tensor of a shard must be mapped to that shard, no tensor
// may be in two shards, and metadata.total_size (when given) must be the tensors' bytes. Each
// problem is an InvalidArgument naming the files and the tensor.
//
// Thread-safety: immutable after construction; reads may come from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/safetensors.h"
#include "runtime/common/dtype.h"

namespace zrt::hf {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

class HfWeights {
 public:
  // `path`: a model directory (its model.safetensors.index.json, else its model.safetensors),
  // a .safetensors file, or an index .json file.
  explicit HfWeights(const std::string& path);

  // What was opened: the single file or the index.
  const std::string& path() const { return path_; }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // Throws InvalidArgument naming `path()` when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The file holding tensor `name`.
  const std::string& file_of(const std::string& name) const;
  // Elements [first, first + count) of tensor `name`, as fp32.
  void read_f32(const std::string& name, std::int64_t first, std::int64_t count, float* out) const;
  std::vector<float> read_f32(const std::string& name) const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  const SafetensorsFile& file(const std::string& name) const;
};

// Bytes from a size text: "5GB", "500MB", "1.5GB", "200KB", "12345" (bytes); KB/MB/GB are powers
// of 1000 and KiB/MiB/GiB of 1024, as transformers reads max_shard_size. InvalidArgument names
// `what` (e.g. "--max-shard-size") for anything else or a size of 0.
std::uint64_t parse_byte_size(const std::string& text, const std::string& what);

// Writes `tensors` in `dtype` into `dir` as transformers' save_pretrained does: one
// model.safetensors when their bytes are at most `max_shard_bytes`, else model-00001-of-0000N
// .safetensors shards (tensors in order, a new shard when the next tensor would pass the limit;
// a tensor larger than the limit gets a shard to itself) and model.safetensors.index.json.
// Earlier model*.safetensors / index files in `dir` are removed first, so the directory holds
// one consistent set. Returns the files written (names in `dir`).
std::vector<std::string> write_hf_weights(const std::string& dir, const SafetensorsTensors& tensors,
                                          DType dtype, std::uint64_t max_shard_bytes);

}  // namespace zrt::hf
