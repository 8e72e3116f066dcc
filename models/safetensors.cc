#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "runtime/common/error.h"
#include "runtime/common/synced_file.h"

namespace zrt {

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;  // the format's own limit is 100 MB

std::uint64_t element_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

const char* safetensors_dtype_name(DType dtype, const std::string& path) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
    default:
      ZRT_THROW(InvalidArgument, "{}: safetensors are written in fp32, bf16 or fp16, not {}", path,
                dtype_name(dtype));
  }
}

// Reads exactly `bytes` at `offset`; a short read means the file shrank since it was opened.
void pread_all(int fd, char* out, std::uint64_t bytes, std::uint64_t offset,
               const std::string& path) {
  while (bytes > 0) {
    const ssize_t r = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      ZRT_THROW(Error, "{}: read failed at byte {}: {}", path, offset, std::strerror(errno));
    if (r == 0) {
      ZRT_THROW(InvalidArgument, "{}: truncated: no data at byte {} (the file changed?)", path,
                offset);
    }
    out += r;
    bytes -= static_cast<std::uint64_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

// The header length from the file's first 8 bytes (read by `read8`), checked against its size.
template <typename Read8>
std::uint64_t check_header_length(const std::string& path, std::uint64_t file_size, Read8 read8) {
  if (file_size < 8) {
    ZRT_THROW(InvalidArgument, "{}: truncated: {} bytes, smaller than the 8-byte header length",
              path, file_size);
  }
  char length_bytes[8];
  read8(length_bytes);
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) {
    header_length = (header_length << 8) | static_cast<unsigned char>(length_bytes[i]);
  }
  if (header_length > kMaxHeader || header_length > file_size - 8) {
    ZRT_THROW(InvalidArgument,
              "{}: header length {} runs past the end of the file ({} bytes) or above 100 MB", path,
              header_length, file_size);
  }
  return header_length;
}

}  // namespace

// Where the data section lives: a file read with pread (thread-safe), or bytes in memory.
struct SafetensorsFile::Source {
  int fd = -1;
  std::string bytes;  // from_bytes: the whole file
  ~Source() {
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto source = std::make_shared<Source>();
  source->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (source->fd < 0) {
    ZRT_THROW(InvalidArgument, "{}: cannot open safetensors file: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(source->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ZRT_THROW(InvalidArgument, "{}: not a regular file", path);
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  source_ = source;
  const std::uint64_t header_length = check_header_length(
      path, file_size, [&](char* out) { pread_all(source->fd, out, 8, 0, path); });
  std::string header(header_length, '\0');
  pread_all(source->fd, header.data(), header_length, 8, path);
  data_start_ = 8 + header_length;
  parse(header, file_size - data_start_);
}

SafetensorsFile SafetensorsFile::from_bytes(const std::string& bytes, const std::string& name) {
  SafetensorsFile f;
  f.path_ = name;
  auto source = std::make_shared<Source>();
  source->bytes = bytes;
  f.source_ = source;
  const std::uint64_t header_length = check_header_length(
      name, bytes.size(), [&](char* out) { std::memcpy(out, bytes.data(), 8); });
  f.data_start_ = 8 + header_length;
  f.parse(bytes.substr(8, header_length), bytes.size() - f.data_start_);
  return f;
}

void SafetensorsFile::parse(const std::string& header, std::uint64_t data_size) {
  const std::string& path = path_;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    ZRT_THROW(InvalidArgument, "{}: the header is not valid JSON: {}", path, e.what());
  }
  if (!doc.is_object()) ZRT_THROW(InvalidArgument, "{}: the header is not a JSON object", path);
  std::vector<std::pair<std::pair<std::uint64_t, std::uint64_t>, std::string>> ranges;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object())
        ZRT_THROW(InvalidArgument, "{}: __metadata__ is not an object", path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          ZRT_THROW(InvalidArgument, "{}: __metadata__.{} is not a string", path, m.key());
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto& t = it.value();
    const std::string& name = it.key();
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("data_offsets")) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}' needs dtype, shape and data_offsets", path, name);
    }
    SafetensorsEntry e;
    if (!t["dtype"].is_string())
      ZRT_THROW(InvalidArgument, "{}: tensor '{}': dtype is not a string", path, name);
    e.dtype = t["dtype"].get<std::string>();
    const std::uint64_t elem = element_size(e.dtype);
    if (elem == 0) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}' has dtype {}; supported: F32, BF16, F16", path,
                name, e.dtype);
    }
    std::uint64_t count = 1;
    if (!t["shape"].is_array())
      ZRT_THROW(InvalidArgument, "{}: tensor '{}': shape is not a list", path, name);
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (1ull << 40)) {
        ZRT_THROW(InvalidArgument, "{}: tensor '{}' has a bad dimension {}", path, name, d.dump());
      }
      e.shape.push_back(d.get<std::int64_t>());
      count *= d.get<std::uint64_t>();
      if (count > (1ull << 40))
        ZRT_THROW(InvalidArgument, "{}: tensor '{}' is too large", path, name);
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}': data_offsets must be [begin, end]", path, name);
    }
    e.begin = off[0].get<std::uint64_t>();
    e.end = off[1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      ZRT_THROW(InvalidArgument,
                "{}: tensor '{}': data_offsets [{}, {}] run past the {} bytes of data (a "
                "truncated file?)",
                path, name, e.begin, e.end, data_size);
    }
    if (e.end - e.begin != count * elem) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}': {} x {} needs {} bytes but data_offsets span {}",
                path, name, e.dtype, t["shape"].dump(), count * elem, e.end - e.begin);
    }
    ranges.push_back({{e.begin, e.end}, name});
    tensors_[name] = e;
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first.first < ranges[i - 1].first.second) {
      ZRT_THROW(InvalidArgument, "{}: two tensors' data overlap at byte {} ('{}' and '{}')", path,
                ranges[i].first.first, ranges[i - 1].second, ranges[i].second);
    }
  }
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) ZRT_THROW(InvalidArgument, "{}: no tensor '{}'", path_, name);
  std::vector<float> out(static_cast<std::size_t>(it->second.numel()));
  read_f32(name, 0, it->second.numel(), out.data());
  return out;
}

void SafetensorsFile::read_f32(const std::string& name, std::int64_t first, std::int64_t count,
                               float* out) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) ZRT_THROW(InvalidArgument, "{}: no tensor '{}'", path_, name);
  const SafetensorsEntry& e = it->second;
  if (first < 0 || count < 0 || first + count > e.numel()) {
    ZRT_THROW(InvalidArgument, "{}: tensor '{}': elements [{}, {}) are outside its {}", path_, name,
              first, first + count, e.numel());
  }
  const std::uint64_t elem = element_size(e.dtype);
  const std::uint64_t offset = data_start_ + e.begin + static_cast<std::uint64_t>(first) * elem;
  const std::uint64_t bytes = static_cast<std::uint64_t>(count) * elem;
  if (e.dtype == "F32") {  // straight into the destination
    read_bytes(offset, bytes, reinterpret_cast<char*>(out));
    return;
  }
  // Half precision: through a bounded bounce buffer.
  constexpr std::int64_t kChunk = 1 << 16;
  std::vector<std::uint16_t> half(static_cast<std::size_t>(std::min(count, kChunk)));
  for (std::int64_t done = 0; done < count; done += kChunk) {
    const std::int64_t n = std::min(kChunk, count - done);
    read_bytes(offset + static_cast<std::uint64_t>(done) * 2, static_cast<std::uint64_t>(n) * 2,
               reinterpret_cast<char*>(half.data()));
    for (std::int64_t i = 0; i < n; ++i) {
      out[done + i] = e.dtype == "BF16" ? to_float(bf16{half[static_cast<std::size_t>(i)]})
                                        : to_float(fp16{half[static_cast<std::size_t>(i)]});
    }
  }
}

void SafetensorsFile::read_bytes(std::uint64_t offset, std::uint64_t bytes, char* out) const {
  // An empty tensor (a shape with a 0) reads nothing, into a destination that may be null (an
  // empty vector's data(); memcpy's arguments must not be, even for no bytes).
  if (bytes == 0) return;
  if (source_->fd >= 0) {
    pread_all(source_->fd, out, bytes, offset, path_);
  } else {
    std::memcpy(out, source_->bytes.data() + offset, bytes);
  }
}

std::uint64_t safetensors_bytes(std::int64_t numel, DType dtype) {
  return static_cast<std::uint64_t>(numel) * (dtype == DType::kFloat32 ? 4 : 2);
}

void write_safetensors(const std::string& path, const SafetensorsTensors& tensors,
                       const std::map<std::string, std::string>& metadata, DType dtype) {
  const char* dtype_name = safetensors_dtype_name(dtype, path);
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    std::int64_t numel = 1;
    for (std::int64_t d : t.first) numel *= d;
    if (numel != static_cast<std::int64_t>(t.second.size())) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}' has {} values for a shape of {} elements", path,
                name, t.second.size(), numel);
    }
    const std::uint64_t bytes = safetensors_bytes(numel, dtype);
    header[name] = {
        {"dtype", dtype_name}, {"shape", t.first}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // writers pad the header to 8 bytes
  const std::string tmp = path + ".tmp";
  // A failed write (a full disk) takes its partial file with it: only a whole file is renamed
  // into place, and nothing half-written is left to fill the disk or be mistaken for an export.
  struct RemoveUnlessKept {
    const std::string& file;
    bool keep = false;
    ~RemoveUnlessKept() {
      std::error_code ignored;
      if (!keep) std::filesystem::remove(file, ignored);
    }
  } partial{tmp};
  {
    // Written with fsync and a checked close: an export removes the earlier weights only once
    // the new ones are on the device (hf_weights.cc).
    SyncedFileWriter out(tmp);
    std::uint8_t length[8];
    const std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>((n >> (8 * i)) & 0xff);
    out.write(length, sizeof length);
    out.write(text.data(), text.size());
    std::vector<std::uint16_t> half;
    for (const auto& [name, t] : tensors) {
      const std::vector<float>& v = t.second;
      if (dtype == DType::kFloat32) {
        out.write(v.data(), v.size() * 4);
        continue;
      }
      half.resize(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        half[i] = dtype == DType::kBFloat16 ? to_bf16(v[i]).bits : to_fp16(v[i]).bits;
      }
      out.write(half.data(), half.size() * 2);
    }
    out.commit();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) ZRT_THROW(Error, "{}: cannot rename {} to it: {}", path, tmp, ec.message());
  partial.keep = true;
}

}  // namespace zrt
