#include "models/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "runtime/common/dtype.h"
#include "runtime/common/error.h"

namespace zrt {

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;  // the format's own limit is 100 MB

std::uint64_t element_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ZRT_THROW(InvalidArgument, "{}: cannot open safetensors file", path);
  std::error_code ec;
  const std::uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) ZRT_THROW(InvalidArgument, "{}: cannot read its size: {}", path, ec.message());
  read(in, file_size);
}

SafetensorsFile SafetensorsFile::from_bytes(const std::string& bytes, const std::string& name) {
  SafetensorsFile f;
  f.path_ = name;
  std::istringstream in(bytes);
  f.read(in, bytes.size());
  return f;
}

void SafetensorsFile::read(std::istream& in, std::uint64_t file_size) {
  const std::string& path = path_;
  if (file_size < 8) {
    ZRT_THROW(InvalidArgument, "{}: truncated: {} bytes, smaller than the 8-byte header length",
              path, file_size);
  }
  unsigned char length_bytes[8];
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  if (header_length > kMaxHeader || header_length > file_size - 8) {
    ZRT_THROW(InvalidArgument,
              "{}: header length {} runs past the end of the file ({} bytes) or above 100 MB", path,
              header_length, file_size);
  }
  std::string header(header_length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_length));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    ZRT_THROW(InvalidArgument, "{}: the header is not valid JSON: {}", path, e.what());
  }
  if (!doc.is_object()) ZRT_THROW(InvalidArgument, "{}: the header is not a JSON object", path);
  const std::uint64_t data_size = file_size - 8 - header_length;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
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
                "{}: tensor '{}': data_offsets [{}, {}] run past the {} bytes of data", path, name,
                e.begin, e.end, data_size);
    }
    if (e.end - e.begin != count * elem) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}': {} x {} needs {} bytes but data_offsets span {}",
                path, name, e.dtype, t["shape"].dump(), count * elem, e.end - e.begin);
    }
    ranges.emplace_back(e.begin, e.end);
    tensors_[name] = e;
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      ZRT_THROW(InvalidArgument, "{}: two tensors' data overlap at byte {}", path, ranges[i].first);
    }
  }
  data_.resize(data_size);
  in.read(data_.data(), static_cast<std::streamsize>(data_size));
  if (static_cast<std::uint64_t>(in.gcount()) != data_size) {
    ZRT_THROW(InvalidArgument, "{}: truncated while reading the data", path);
  }
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) ZRT_THROW(InvalidArgument, "{}: no tensor '{}'", path_, name);
  const SafetensorsEntry& e = it->second;
  const char* p = data_.data() + e.begin;
  const std::uint64_t n = (e.end - e.begin) / element_size(e.dtype);
  std::vector<float> out(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    if (e.dtype == "F32") {
      std::memcpy(&out[i], p + 4 * i, 4);
    } else if (e.dtype == "BF16") {
      bf16 h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = to_float(h);
    } else {
      fp16 h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = to_float(h);
    }
  }
  return out;
}

void write_safetensors(
    const std::string& path,
    const std::vector<
        std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>>& tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::uint64_t bytes = t.second.size() * 4;
    header[name] = {
        {"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // writers pad the header to 8 bytes
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) ZRT_THROW(Error, "{}: cannot write: {}", tmp, std::strerror(errno));
    std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : tensors) {
      out.write(reinterpret_cast<const char*>(t.second.data()),
                static_cast<std::streamsize>(t.second.size() * 4));
    }
    out.flush();
    if (!out) ZRT_THROW(Error, "{}: write failed: {}", tmp, std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) ZRT_THROW(Error, "{}: cannot rename {} to it: {}", path, tmp, ec.message());
}

}  // namespace zrt
