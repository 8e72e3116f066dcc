// A thin RAII layer over the HDF5 C API for checkpoint files: handles that close themselves,
// attributes by name, 1-D/2-D contiguous datasets with block checksums, and errors that name the
// file, the dataset and HDF5's own reason.
//
// Block checksums: a dataset's bytes are cut into blocks of `crc32c_block_bytes` (an attribute,
// 1 MiB for tensor data; the whole dataset for small tables) and the CRC-32C of each block is
// stored in the uint32 array attribute `crc32c`. A reader of a range verifies the blocks that
// cover it, so resharding checks what it reads without reading whole files.
//
// Thread-safety: Debian's HDF5 is built thread-safe (one global lock), but zrt keeps all HDF5
// calls of a process on one thread at a time (the trainer's, or the async checkpoint writer's).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/checkpoint/tensor_writer.h"

namespace zrt::checkpoint {

// Owns one HDF5 identifier (file, dataset, dataspace, type, property list, attribute).
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  ~H5Id() { reset(); }
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Gives up ownership without closing; returns the identifier.
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// The last failed HDF5 call's message ("" if none) with the operating system's reason when a
// frame of the error stack has one ("... : No space left on device"); clears the stack.
std::string h5_error_detail();

// An open HDF5 file and its path (for messages).
class H5File {
 public:
  static H5File create(const std::string& path);     // truncates; file locking off
  static H5File open_read(const std::string& path);  // throws naming the file if not HDF5
  const std::string& path() const { return path_; }
  hid_t id() const { return file_.get(); }
  bool has(const std::string& dataset) const;
  // Allocates `bytes` of disk blocks for the file up front (fallocate, the size unchanged), so
  // a full disk fails here, with the operating system's reason and before HDF5 has written
  // anything it would then fail to flush. No-op where the file system cannot preallocate.
  void reserve(std::int64_t bytes) const;
  void close();  // flushes and closes; throws on failure

 private:
  // The file's descriptor under HDF5's default (sec2) driver; -1 under another driver.
  int descriptor() const;
  std::string path_;
  H5Id file_;
};

// Where a dataset lives, for messages: "<file>: dataset '/master'".
std::string where(const H5File& file, const std::string& dataset);

// ---- attributes (on the file's root group, or on a dataset) -----------------------------------
void write_attr(hid_t object, const std::string& name, std::int64_t value);
void write_attr(hid_t object, const std::string& name, double value);
void write_attr(hid_t object, const std::string& name, const std::string& value);
void write_attr(hid_t object, const std::string& name, const std::vector<std::uint32_t>& values);
// Whether the attribute exists; throws InvalidArgument naming `context` when HDF5 cannot tell
// (the object's metadata is damaged: HDF5's own checksum of it failed, or the file is cut short).
bool has_attr(hid_t object, const std::string& name, const std::string& context);
// Readers throw InvalidArgument naming `context` and the attribute when it is missing, of
// another type or size, or unreadable (damaged metadata, as has_attr).
std::int64_t read_attr_int(hid_t object, const std::string& name, const std::string& context);
double read_attr_double(hid_t object, const std::string& name, const std::string& context);
std::string read_attr_string(hid_t object, const std::string& name, const std::string& context);
std::vector<std::uint32_t> read_attr_u32(hid_t object, const std::string& name,
                                         const std::string& context, std::int64_t expected_count);

// ---- datasets ---------------------------------------------------------------------------------
enum class H5Elem { kFloat32, kInt64, kString };  // element kinds checkpoints use

constexpr std::int64_t kTensorBlockBytes = std::int64_t{1} << 20;
// Objects of at least this many bytes start on a 4 KiB boundary of the file (H5Pset_alignment),
// so a TensorWriter can write their bodies with O_DIRECT; smaller ones pack as before.
constexpr std::int64_t kAlignedObjectBytes = std::int64_t{1} << 20;

// Writes a contiguous dataset of `dims` elements from `data` with its block checksums
// (block_bytes 0: one block for the whole dataset). For kString, `data` is an array of fixed
// `string_size`-byte, NUL-padded names. With a `tensor_writer` (for the same file), the bytes
// go through it into the space HDF5 allocated, past the page cache where possible, with the
// checksums computed while they are written (see tensor_writer.h); without, through H5Dwrite.
// `crc_seconds`, if given, gets the time spent on the checksums added to it.
void write_dataset(const H5File& file, const std::string& name, H5Elem elem,
                   const std::vector<std::int64_t>& dims, const void* data,
                   std::int64_t block_bytes = 0, std::int64_t string_size = 0,
                   TensorWriter* tensor_writer = nullptr, double* crc_seconds = nullptr);
// The same from runs of host memory, concatenated in order (their bytes must add up to the
// dataset's): a rank's state written straight from the engine's per-unit slices.
void write_dataset(const H5File& file, const std::string& name, H5Elem elem,
                   const std::vector<std::int64_t>& dims, const std::vector<HostBytes>& source,
                   std::int64_t block_bytes = 0, std::int64_t string_size = 0,
                   TensorWriter* tensor_writer = nullptr, double* crc_seconds = nullptr);

// An open dataset whose shape and element type were checked; reads ranges and verifies them.
class H5Dataset {
 public:
  // Opens `name` in `file` and checks its element kind and rank-1 length (or rank-2 shape):
  // a missing dataset, another type (naming both), another length — InvalidArgument naming the
  // file and the dataset. `expected` are the dims the config implies (checked before anything
  // is allocated from the file).
  H5Dataset(const H5File& file, const std::string& name, H5Elem elem,
            const std::vector<std::int64_t>& expected, std::int64_t string_size = 0);
  std::int64_t elements() const { return elements_; }
  std::int64_t element_bytes() const { return element_bytes_; }
  std::int64_t block_bytes() const { return block_bytes_; }
  // Reads elements [first, first + count) into out; returns the bytes read from the file. With
  // verify, every checksum block the range touches is checked (throws naming the file, the
  // dataset, the block and both checksums on a mismatch): the blocks wholly inside the range
  // are read straight into `out` and checked there, a partly covered block at either end is
  // read whole into `scratch`, checked, and its part copied.
  std::int64_t read(std::int64_t first, std::int64_t count, void* out, bool verify,
                    std::vector<unsigned char>& scratch) const;
  void read_all(void* out) const;  // whole dataset, verified
  // Verifies every block, streaming through a bounded buffer; returns the bytes checked.
  std::int64_t verify_all() const;
  const std::string& where() const { return where_; }

 private:
  void read_raw(std::int64_t first_elem, std::int64_t count, void* out) const;
  void check_block(std::int64_t block, const unsigned char* bytes, std::int64_t n) const;
  std::string where_;
  H5Id dataset_;
  H5Id mem_type_;
  std::int64_t elements_ = 0;
  std::int64_t element_bytes_ = 0;
  std::int64_t block_bytes_ = 0;
  std::vector<std::uint32_t> crcs_;
};

}  // namespace zrt::checkpoint
