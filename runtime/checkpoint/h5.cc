#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/tensor_writer.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "runtime/checkpoint/crc32c.h"
#include "runtime/common/error.h"

namespace zrt::checkpoint {

namespace {

// HDF5 prints its error stack to stderr by default; zrt reports errors itself.
void silence_hdf5() {
  static const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

// What an HDF5 error stack says: the API call's own message (the first frame, walking down)
// and, if a frame below carries the operating system's reason (the sec2 driver's "errno = 28,
// error message = 'No space left on device'"), that reason.
struct ErrorStackText {
  std::string top;
  std::string os_reason;
};

herr_t read_frame(unsigned n, const H5E_error2_t* e, void* out) {
  auto& text = *static_cast<ErrorStackText*>(out);
  if (e->desc == nullptr) return 0;
  const std::string desc = e->desc;
  if (n == 0) text.top = desc;
  const std::string key = "error message = '";
  const std::size_t at = desc.find(key);
  if (text.os_reason.empty() && at != std::string::npos) {
    const std::size_t end = desc.find('\'', at + key.size());
    text.os_reason = desc.substr(
        at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
  }
  return 0;
}

std::string elem_name(H5Elem e) {
  switch (e) {
    case H5Elem::kFloat32:
      return "float32";
    case H5Elem::kInt64:
      return "int64";
    case H5Elem::kString:
      return "string";
  }
  return "?";
}

// A readable name of a file's element type ("float64", "int32", "string(32)").
std::string type_name(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  switch (cls) {
    case H5T_FLOAT:
      return fmt::format("float{}", size * 8);
    case H5T_INTEGER:
      return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", size * 8);
    case H5T_STRING:
      return fmt::format("string({})", size);
    default:
      return fmt::format("class {} of {} bytes", static_cast<int>(cls), size);
  }
}

H5Id string_type(std::int64_t size) {
  H5Id t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), static_cast<std::size_t>(size));
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  return t;
}

// Bytes per element of a dataset of `elem` (fixed-size strings: string_size).
std::int64_t element_bytes(H5Elem elem, std::int64_t string_size) {
  switch (elem) {
    case H5Elem::kInt64:
      return 8;
    case H5Elem::kString:
      return string_size;
    case H5Elem::kFloat32:
      break;
  }
  return 4;
}

std::vector<std::uint32_t> block_checksums(const void* data, std::int64_t bytes,
                                           std::int64_t block) {
  std::vector<std::uint32_t> crcs;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::int64_t at = 0; at < bytes || crcs.empty(); at += block) {
    const std::int64_t n = std::min(block, bytes - at);
    crcs.push_back(crc32c(p + at, static_cast<std::size_t>(std::max<std::int64_t>(n, 0))));
    if (bytes == 0) break;
  }
  return crcs;
}

}  // namespace

void H5Id::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    default:
      break;
  }
  id_ = H5I_INVALID_HID;
}

std::string h5_error_detail() {
  ErrorStackText text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, read_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  if (text.os_reason.empty() || text.top.find(text.os_reason) != std::string::npos) {
    return text.top;
  }
  return fmt::format("{}: {}", text.top, text.os_reason);
}

std::string where(const H5File& file, const std::string& dataset) {
  return fmt::format("{}: dataset '{}'", file.path(), dataset);
}

H5File H5File::create(const std::string& path) {
  silence_hdf5();
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  // Shared file systems (NFS, Lustre) often lack the locks HDF5 takes; each file has one writer.
  H5Pset_file_locking(fapl.get(), false, true);
  // Dense attribute storage: checksum arrays of large datasets exceed 64 KiB.
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  // Large datasets on 4 KiB boundaries, for O_DIRECT (TensorWriter). Readers need nothing.
  H5Pset_alignment(fapl.get(), kAlignedObjectBytes, 4096);
  H5File f;
  f.path_ = path;
  f.file_ = H5Id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!f.file_.valid()) {
    ZRT_THROW(Error, "{}: cannot create the HDF5 file: {}", path, h5_error_detail());
  }
  return f;
}

H5File H5File::open_read(const std::string& path) {
  silence_hdf5();
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_file_locking(fapl.get(), false, true);
  H5File f;
  f.path_ = path;
  if (!std::filesystem::exists(path)) ZRT_THROW(InvalidArgument, "{}: no such file", path);
  f.file_ = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!f.file_.valid()) {
    ZRT_THROW(InvalidArgument, "{}: not a readable HDF5 file (truncated, damaged or not HDF5): {}",
              path, h5_error_detail());
  }
  return f;
}

bool H5File::has(const std::string& dataset) const {
  const htri_t exists = H5Lexists(file_.get(), dataset.c_str(), H5P_DEFAULT);
  h5_error_detail();
  return exists > 0;
}

int H5File::descriptor() const {
  if (!file_.valid()) return -1;
  H5Id fapl(H5Fget_access_plist(file_.get()));
  void* handle = nullptr;
  // The default (sec2) driver's handle is a pointer to its file descriptor; other drivers are
  // left alone.
  if (H5Pget_driver(fapl.get()) != H5FD_SEC2 ||
      H5Fget_vfd_handle(file_.get(), fapl.get(), &handle) < 0 || handle == nullptr) {
    h5_error_detail();
    return -1;
  }
  return *static_cast<int*>(handle);
}

void H5File::reserve(std::int64_t bytes) const {
  const int fd = bytes > 0 ? descriptor() : -1;
  if (fd < 0) return;
  // KEEP_SIZE: the blocks are allocated, the file's size (HDF5's end of file) is unchanged.
  if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, bytes) == 0) return;
  const int err = errno;
  // A file system without fallocate (some network file systems) just gets no reservation.
  if (err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) return;
  ZRT_THROW(Error, "{}: cannot reserve {} bytes for the file: {}", path_, bytes,
            std::strerror(err));
}

void H5File::close() {
  if (!file_.valid()) return;
  // One H5Fclose, whatever it returns: after a failed close (its final flush hit a write
  // error) the identifier may survive with its file half torn down, and closing it again
  // crashes inside HDF5 (a full disk used to end the run with a segmentation fault here).
  const hid_t id = file_.release();
  if (H5Fclose(id) < 0) {
    ZRT_THROW(Error, "{}: closing the HDF5 file failed: {}", path_, h5_error_detail());
  }
}

// ---- attributes -------------------------------------------------------------------------------

namespace {
void write_attr_raw(hid_t object, const std::string& name, hid_t file_type, hid_t mem_type,
                    hsize_t count, const void* data, bool scalar) {
  if (H5Aexists(object, name.c_str()) > 0) H5Adelete(object, name.c_str());
  H5Id space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &count, nullptr));
  H5Id attr(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, data) < 0) {
    ZRT_THROW(Error, "writing attribute '{}' failed: {}", name, h5_error_detail());
  }
}

// A damaged object header or attribute heap (HDF5 checksums its metadata: the files are written
// with object headers of version 2) fails the lookup itself: reported as such, not as a missing
// attribute, which would send the user after an older or foreign file.
[[noreturn]] void throw_unreadable_attr(const std::string& context, const std::string& name) {
  ZRT_THROW(InvalidArgument,
            "{}: attribute '{}' cannot be read: {} (the file's metadata is damaged: the file is "
            "corrupt or truncated)",
            context, name, h5_error_detail());
}

H5Id open_attr(hid_t object, const std::string& name, const std::string& context) {
  if (!has_attr(object, name, context)) {
    ZRT_THROW(InvalidArgument, "{}: attribute '{}' is missing", context, name);
  }
  H5Id attr(H5Aopen(object, name.c_str(), H5P_DEFAULT));
  if (!attr.valid()) throw_unreadable_attr(context, name);
  return attr;
}

void read_attr_value(const H5Id& attr, hid_t mem_type, void* out, const std::string& context,
                     const std::string& name) {
  if (H5Aread(attr.get(), mem_type, out) < 0) throw_unreadable_attr(context, name);
}

// The attribute's element count, after checking its class.
hssize_t attr_count(const H5Id& attr, H5T_class_t want, const std::string& context,
                    const std::string& name) {
  H5Id type(H5Aget_type(attr.get()));
  if (!type.valid()) throw_unreadable_attr(context, name);
  if (H5Tget_class(type.get()) != want) {
    ZRT_THROW(InvalidArgument, "{}: attribute '{}' has type {}", context, name,
              type_name(type.get()));
  }
  H5Id space(H5Aget_space(attr.get()));
  if (!space.valid()) throw_unreadable_attr(context, name);
  return H5Sget_simple_extent_npoints(space.get());
}
}  // namespace

void write_attr(hid_t object, const std::string& name, std::int64_t value) {
  write_attr_raw(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, 1, &value, true);
}
void write_attr(hid_t object, const std::string& name, double value) {
  write_attr_raw(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1, &value, true);
}
void write_attr(hid_t object, const std::string& name, const std::string& value) {
  H5Id type = string_type(static_cast<std::int64_t>(std::max<std::size_t>(value.size(), 1)));
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  write_attr_raw(object, name, type.get(), type.get(), 1, padded.data(), true);
}
void write_attr(hid_t object, const std::string& name, const std::vector<std::uint32_t>& values) {
  write_attr_raw(object, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, values.size(), values.data(),
                 false);
}

bool has_attr(hid_t object, const std::string& name, const std::string& context) {
  const htri_t r = H5Aexists(object, name.c_str());
  if (r < 0) throw_unreadable_attr(context, name);
  return r > 0;
}

std::int64_t read_attr_int(hid_t object, const std::string& name, const std::string& context) {
  H5Id attr = open_attr(object, name, context);
  if (attr_count(attr, H5T_INTEGER, context, name) != 1) {
    ZRT_THROW(InvalidArgument, "{}: attribute '{}' is not one integer", context, name);
  }
  std::int64_t v = 0;
  read_attr_value(attr, H5T_NATIVE_INT64, &v, context, name);
  return v;
}

double read_attr_double(hid_t object, const std::string& name, const std::string& context) {
  H5Id attr = open_attr(object, name, context);
  if (attr_count(attr, H5T_FLOAT, context, name) != 1) {
    ZRT_THROW(InvalidArgument, "{}: attribute '{}' is not one number", context, name);
  }
  double v = 0;
  read_attr_value(attr, H5T_NATIVE_DOUBLE, &v, context, name);
  return v;
}

std::string read_attr_string(hid_t object, const std::string& name, const std::string& context) {
  H5Id attr = open_attr(object, name, context);
  if (attr_count(attr, H5T_STRING, context, name) != 1) {
    ZRT_THROW(InvalidArgument, "{}: attribute '{}' is not one string", context, name);
  }
  H5Id type(H5Aget_type(attr.get()));
  if (H5Tis_variable_str(type.get()) > 0) {
    ZRT_THROW(InvalidArgument, "{}: attribute '{}' is a variable-length string", context, name);
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  read_attr_value(attr, type.get(), value.data(), context, name);
  value.resize(std::strlen(value.c_str()));
  return value;
}

std::vector<std::uint32_t> read_attr_u32(hid_t object, const std::string& name,
                                         const std::string& context, std::int64_t expected_count) {
  H5Id attr = open_attr(object, name, context);
  const hssize_t n = attr_count(attr, H5T_INTEGER, context, name);
  if (n != expected_count) {
    ZRT_THROW(InvalidArgument, "{}: attribute '{}' holds {} values, expected {}", context, name, n,
              expected_count);
  }
  std::vector<std::uint32_t> values(static_cast<std::size_t>(n));
  read_attr_value(attr, H5T_NATIVE_UINT32, values.data(), context, name);
  return values;
}

// ---- datasets ---------------------------------------------------------------------------------

void write_dataset(const H5File& file, const std::string& name, H5Elem elem,
                   const std::vector<std::int64_t>& dims, const void* data,
                   std::int64_t block_bytes, std::int64_t string_size, TensorWriter* tensor_writer,
                   double* crc_seconds) {
  std::int64_t elements = 1;
  for (std::int64_t d : dims) elements *= d;
  write_dataset(file, name, elem, dims,
                std::vector<HostBytes>{{data, elements * element_bytes(elem, string_size)}},
                block_bytes, string_size, tensor_writer, crc_seconds);
}

void write_dataset(const H5File& file, const std::string& name, H5Elem elem,
                   const std::vector<std::int64_t>& dims, const std::vector<HostBytes>& source,
                   std::int64_t block_bytes, std::int64_t string_size, TensorWriter* tensor_writer,
                   double* crc_seconds) {
  std::vector<hsize_t> hdims(dims.begin(), dims.end());
  std::int64_t elements = 1;
  for (std::int64_t d : dims) elements *= d;
  H5Id type;
  hid_t file_type = H5T_IEEE_F32LE;
  hid_t mem_type = H5T_NATIVE_FLOAT;
  const std::int64_t elem_bytes = element_bytes(elem, string_size);
  if (elem == H5Elem::kInt64) {
    file_type = H5T_STD_I64LE;
    mem_type = H5T_NATIVE_INT64;
  } else if (elem == H5Elem::kString) {
    type = string_type(string_size);
    file_type = mem_type = type.get();
  }
  const std::int64_t bytes = elements * elem_bytes;
  std::int64_t source_bytes = 0;
  for (const HostBytes& run : source) source_bytes += run.bytes;
  ZRT_CHECK(source_bytes == bytes, "{}: {} bytes of data for {} elements of {} bytes",
            where(file, name), source_bytes, elements, elem_bytes);
  if (block_bytes <= 0) block_bytes = std::max<std::int64_t>(bytes, elem_bytes);
  H5Id space(H5Screate_simple(static_cast<int>(hdims.size()), hdims.data(), nullptr));
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  // Allocate at creation and never write fill values: the data is written right after.
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  H5Id ds(H5Dcreate2(file.id(), name.c_str(), file_type, space.get(), H5P_LINK_CREATE_DEFAULT,
                     dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) {
    ZRT_THROW(Error, "{}: cannot create: {}", where(file, name), h5_error_detail());
  }
  write_attr(ds.get(), "crc32c_block_bytes", block_bytes);
  // HADDR_UNDEF: HDF5 placed the data nowhere we can write directly (not expected for an
  // early-allocated contiguous dataset); H5Dwrite then.
  // The writer copies raw bytes: only where the memory type is the file's (little-endian hosts).
  const bool raw = tensor_writer != nullptr && H5Tequal(mem_type, file_type) > 0;
  const haddr_t address = raw ? H5Dget_offset(ds.get()) : HADDR_UNDEF;
  std::vector<std::uint32_t> crcs;
  if (address != HADDR_UNDEF && elements > 0) {
    crcs =
        tensor_writer->write(static_cast<std::int64_t>(address), source, block_bytes, crc_seconds);
  } else {
    h5_error_detail();  // H5Dget_offset's error stack, if it failed
    // H5Dwrite takes one buffer: runs of memory are joined first (a rare path: no writer, or
    // no file address for the data).
    std::vector<unsigned char> joined;
    const void* data = source.empty() ? nullptr : source[0].data;
    if (source.size() > 1) {
      joined.reserve(static_cast<std::size_t>(bytes));
      for (const HostBytes& run : source) {
        const auto* p = static_cast<const unsigned char*>(run.data);
        joined.insert(joined.end(), p, p + run.bytes);
      }
      data = joined.data();
    }
    if (elements > 0 && H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
      ZRT_THROW(Error, "{}: write failed: {}", where(file, name), h5_error_detail());
    }
    const auto crc_start = std::chrono::steady_clock::now();
    crcs = block_checksums(data, bytes, block_bytes);
    if (crc_seconds != nullptr) {
      *crc_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - crc_start).count();
    }
  }
  write_attr(ds.get(), "crc32c", crcs);
}

H5Dataset::H5Dataset(const H5File& file, const std::string& name, H5Elem elem,
                     const std::vector<std::int64_t>& expected, std::int64_t string_size)
    : where_(checkpoint::where(file, name)) {
  if (!file.has(name)) ZRT_THROW(InvalidArgument, "{}: missing", where_);
  dataset_ = H5Id(H5Dopen2(file.id(), name.c_str(), H5P_DEFAULT));
  if (!dataset_.valid()) {
    ZRT_THROW(InvalidArgument, "{}: cannot open: {}", where_, h5_error_detail());
  }
  H5Id type(H5Dget_type(dataset_.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  const std::size_t size = H5Tget_size(type.get());
  bool ok = false;
  switch (elem) {
    case H5Elem::kFloat32:
      ok = cls == H5T_FLOAT && size == 4;
      mem_type_ = H5Id(H5Tcopy(H5T_NATIVE_FLOAT));
      element_bytes_ = 4;
      break;
    case H5Elem::kInt64:
      ok = cls == H5T_INTEGER && size == 8 && H5Tget_sign(type.get()) == H5T_SGN_2;
      mem_type_ = H5Id(H5Tcopy(H5T_NATIVE_INT64));
      element_bytes_ = 8;
      break;
    case H5Elem::kString:
      ok = cls == H5T_STRING && static_cast<std::int64_t>(size) == string_size &&
           H5Tis_variable_str(type.get()) <= 0;
      mem_type_ = string_type(string_size);
      element_bytes_ = string_size;
      break;
  }
  if (!ok) {
    ZRT_THROW(InvalidArgument, "{}: element type is {}, expected {}{}", where_,
              type_name(type.get()), elem_name(elem),
              elem == H5Elem::kString ? fmt::format("({})", string_size) : "");
  }
  H5Id space(H5Dget_space(dataset_.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const std::vector<std::int64_t> got(dims.begin(), dims.end());
  if (got != expected) {
    auto show = [](const std::vector<std::int64_t>& v) {
      return fmt::format("[{}]", fmt::join(v, ", "));
    };
    ZRT_THROW(InvalidArgument, "{}: shape is {}, expected {} (another model or world size?)",
              where_, show(got), show(expected));
  }
  elements_ = 1;
  for (std::int64_t d : expected) elements_ *= d;
  block_bytes_ = read_attr_int(dataset_.get(), "crc32c_block_bytes", where_);
  if (block_bytes_ <= 0 || block_bytes_ % element_bytes_ != 0) {
    ZRT_THROW(InvalidArgument, "{}: attribute 'crc32c_block_bytes' is {}", where_, block_bytes_);
  }
  const std::int64_t bytes = elements_ * element_bytes_;
  const std::int64_t blocks = std::max<std::int64_t>(1, (bytes + block_bytes_ - 1) / block_bytes_);
  crcs_ = read_attr_u32(dataset_.get(), "crc32c", where_, blocks);
}

void H5Dataset::read_raw(std::int64_t first, std::int64_t count, void* out) const {
  if (count == 0) return;
  H5Id file_space(H5Dget_space(dataset_.get()));
  herr_t rc;
  if (first == 0 && count == elements_) {
    rc = H5Dread(dataset_.get(), mem_type_.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
  } else {
    const hsize_t start = static_cast<hsize_t>(first);
    const hsize_t n = static_cast<hsize_t>(count);
    H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr);
    H5Id mem_space(H5Screate_simple(1, &n, nullptr));
    rc = H5Dread(dataset_.get(), mem_type_.get(), mem_space.get(), file_space.get(), H5P_DEFAULT,
                 out);
  }
  if (rc < 0) {
    ZRT_THROW(InvalidArgument, "{}: reading elements {}..{} failed (truncated file?): {}", where_,
              first, first + count, h5_error_detail());
  }
}

void H5Dataset::check_block(std::int64_t block, const unsigned char* bytes, std::int64_t n) const {
  const std::uint32_t got = crc32c(bytes, static_cast<std::size_t>(n));
  const std::uint32_t want = crcs_[static_cast<std::size_t>(block)];
  if (got != want) {
    ZRT_THROW(InvalidArgument,
              "{}: checksum mismatch in block {} (bytes {}..{}): crc32c {:08x}, stored {:08x} "
              "(the file is corrupt)",
              where_, block, block * block_bytes_, block * block_bytes_ + n, got, want);
  }
}

std::int64_t H5Dataset::read(std::int64_t first, std::int64_t count, void* out, bool verify,
                             std::vector<unsigned char>& scratch) const {
  ZRT_CHECK(first >= 0 && count >= 0 && first + count <= elements_, "{}: range {}+{} of {}", where_,
            first, count, elements_);
  if (count == 0) return 0;
  if (!verify) {
    read_raw(first, count, out);
    return count * element_bytes_;
  }
  std::int64_t read_elements = 0;
  const std::int64_t per_block = block_bytes_ / element_bytes_;
  auto* dst = static_cast<unsigned char*>(out);
  // The whole blocks inside the range are read straight into `out` and verified there; only a
  // partial block at either end goes through `scratch` (read whole, verified, then copied).
  std::int64_t whole0 = (first + per_block - 1) / per_block * per_block;
  std::int64_t whole1 = (first + count) / per_block * per_block;
  if (first + count == elements_) whole1 = first + count;       // the last block may be short
  if (whole0 >= whole1) whole0 = whole1 = first;                // no whole block inside
  auto via_scratch = [&](std::int64_t from, std::int64_t to) {  // [from, to) within one block
    if (from >= to) return;
    const std::int64_t b = from / per_block;
    const std::int64_t e0 = b * per_block;
    const std::int64_t e1 = std::min(elements_, e0 + per_block);
    scratch.resize(static_cast<std::size_t>((e1 - e0) * element_bytes_));
    read_raw(e0, e1 - e0, scratch.data());
    read_elements += e1 - e0;
    check_block(b, scratch.data(), (e1 - e0) * element_bytes_);
    std::memcpy(dst + (from - first) * element_bytes_,
                scratch.data() + (from - e0) * element_bytes_,
                static_cast<std::size_t>((to - from) * element_bytes_));
  };
  if (whole0 == whole1) {
    // Within at most two blocks and covering neither whole.
    const std::int64_t split = std::min(first + count, (first / per_block + 1) * per_block);
    via_scratch(first, split);
    via_scratch(split, first + count);
    return read_elements * element_bytes_;
  }
  via_scratch(first, whole0);
  unsigned char* mid = dst + (whole0 - first) * element_bytes_;
  read_raw(whole0, whole1 - whole0, mid);
  read_elements += whole1 - whole0;
  for (std::int64_t e = whole0; e < whole1; e += per_block) {
    const std::int64_t n = std::min(per_block, whole1 - e);
    check_block(e / per_block, mid + (e - whole0) * element_bytes_, n * element_bytes_);
  }
  via_scratch(whole1, first + count);
  return read_elements * element_bytes_;
}

void H5Dataset::read_all(void* out) const {
  if (elements_ == 0) return;
  read_raw(0, elements_, out);
  const auto* p = static_cast<const unsigned char*>(out);
  const std::int64_t bytes = elements_ * element_bytes_;
  for (std::int64_t b = 0; b * block_bytes_ < bytes; ++b) {
    check_block(b, p + b * block_bytes_, std::min(block_bytes_, bytes - b * block_bytes_));
  }
}

std::int64_t H5Dataset::verify_all() const {
  const std::int64_t per_block = block_bytes_ / element_bytes_;
  // About 64 MiB at a time, in whole blocks.
  const std::int64_t step =
      std::max<std::int64_t>(1, (std::int64_t{64} << 20) / block_bytes_) * per_block;
  std::vector<unsigned char> scratch;
  std::vector<unsigned char> sink;
  H5Id space(H5Dget_space(dataset_.get()));
  if (H5Sget_simple_extent_ndims(space.get()) > 1) {
    sink.resize(static_cast<std::size_t>(elements_ * element_bytes_));
    read_all(sink.data());
    return elements_ * element_bytes_;
  }
  for (std::int64_t at = 0; at < elements_; at += step) {
    const std::int64_t n = std::min(step, elements_ - at);
    sink.resize(static_cast<std::size_t>(n * element_bytes_));
    read(at, n, sink.data(), true, scratch);
  }
  return elements_ * element_bytes_;
}

}  // namespace zrt::checkpoint
