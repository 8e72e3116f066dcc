// A reader and writer of one safetensors file as Hugging Face writes it: an 8-byte little-endian
// header length, a JSON header mapping tensor names to {dtype, shape, data_offsets} (offsets
// relative to the end of the header) plus an optional "__metadata__" object of strings, then
// the raw little-endian data. (A model split over several files with an index is
// models/hf/hf_weights.h.)
//
// Every size and offset is validated against the file before anything is allocated from it:
// a header that runs past the file, offsets out of order, outside the data or overlapping, a
// byte count that disagrees with dtype x shape, an unsupported dtype — each is a
// zrt::InvalidArgument naming the file, the tensor and what is wrong. The data itself is read
// on demand (pread), only the ranges asked for: a rank initialising its slices of an 8B model
// reads its slices, not 16 GB.
//
// Thread-safety: a SafetensorsFile is immutable after construction; read_f32 may be called from
// any thread.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/dtype.h"

namespace zrt {

struct SafetensorsEntry {
  std::string dtype;  // "F32", "BF16", "F16" (others are rejected)
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets into the data section
  std::uint64_t end = 0;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

class SafetensorsFile {
 public:
  // Reads and validates the header; the data stays in the file until read.
  explicit SafetensorsFile(const std::string& path);
  // The same checks on a file's bytes held in memory; `name` starts every message (fuzzing).
  static SafetensorsFile from_bytes(const std::string& bytes, const std::string& name);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor `name` converted to fp32 (throws naming the tensor if it is missing).
  std::vector<float> read_f32(const std::string& name) const;
  // Elements [first, first + count) of tensor `name` (flattened, row-major) converted to fp32.
  // Throws InvalidArgument for a missing tensor or a range outside it, Error for a failed read.
  void read_f32(const std::string& name, std::int64_t first, std::int64_t count, float* out) const;

 private:
  struct Source;  // the open file, or the bytes of from_bytes
  std::string path_;
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const Source> source_;
  std::uint64_t data_start_ = 0;  // the data section's offset in the file

  SafetensorsFile() = default;
  void parse(const std::string& header, std::uint64_t data_size);
  void read_bytes(std::uint64_t offset, std::uint64_t bytes, char* out) const;
};

// Tensors to write: the name, the shape and the fp32 values.
using SafetensorsTensors =
    std::vector<std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>>;

// Writes the tensors (atomically: a temp file, fsynced and closed, then renamed) in their order,
// stored as `dtype` (fp32, bf16 or fp16: "F32", "BF16", "F16"; fp32 values rounded to nearest
// even), with `metadata` in __metadata__. Throws Error naming the file when a write fails.
void write_safetensors(const std::string& path, const SafetensorsTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}},
                       DType dtype = DType::kFloat32);

// The bytes one tensor of `numel` elements takes as `dtype` in a file (fp32 4, bf16/fp16 2).
std::uint64_t safetensors_bytes(std::int64_t numel, DType dtype);

}  // namespace zrt
