// A reader (and a small writer, for tests and export) of the safetensors format as Hugging Face
// writes it: an 8-byte little-endian header length, a JSON header mapping tensor names to
// {dtype, shape, data_offsets} (offsets relative to the end of the header) plus an optional
// "__metadata__" object, then the raw little-endian data.
//
// Every size and offset is validated against the file before anything is allocated from it:
// a header that runs past the file, offsets out of order, outside the data or overlapping, a
// byte count that disagrees with dtype x shape, an unsupported dtype — each is a
// zrt::InvalidArgument naming the file, the tensor and what is wrong.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace zrt {

struct SafetensorsEntry {
  std::string dtype;  // "F32", "BF16", "F16" (others are rejected)
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets into the data section
  std::uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Reads and validates the header; keeps the file's data in memory.
  explicit SafetensorsFile(const std::string& path);
  // The same checks on a file's bytes held in memory; `name` starts every message (fuzzing).
  static SafetensorsFile from_bytes(const std::string& bytes, const std::string& name);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor `name` converted to fp32 (throws naming the tensor if it is missing).
  std::vector<float> read_f32(const std::string& name) const;

 private:
  std::string path_;
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<char> data_;  // the data section

  SafetensorsFile() = default;
  void read(std::istream& in, std::uint64_t file_size);
};

// Writes fp32 tensors (atomically: a temp file then rename) with `metadata` in __metadata__.
void write_safetensors(
    const std::string& path,
    const std::vector<
        std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>>& tensors,
    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace zrt
