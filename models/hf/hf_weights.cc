#include "models/hf/hf_weights.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "runtime/common/error.h"
#include "runtime/common/synced_file.h"

namespace zrt::hf {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_index(const std::string& path) {
  std::ifstream in(path);
  if (!in) ZRT_THROW(InvalidArgument, "{}: cannot open the safetensors index", path);
  std::stringstream text;
  text << in.rdbuf();
  json doc;
  try {
    doc = json::parse(text.str());
  } catch (const json::exception& e) {
    ZRT_THROW(InvalidArgument, "{}: not valid JSON: {}", path, e.what());
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
    ZRT_THROW(InvalidArgument, "{}: a safetensors index needs a \"weight_map\" object", path);
  }
  return doc;
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

std::string shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

}  // namespace

HfWeights::HfWeights(const std::string& path) {
  std::error_code ec;
  fs::path target = path;
  if (fs::is_directory(target, ec)) {
    if (fs::exists(target / kIndexFile, ec)) {
      target /= kIndexFile;
    } else if (fs::exists(target / kSingleFile, ec)) {
      target /= kSingleFile;
    } else {
      ZRT_THROW(InvalidArgument, "{}: holds neither {} nor {}", path, kSingleFile, kIndexFile);
    }
  }
  path_ = target.string();
  if (target.extension() != ".json") {
    files_.push_back(std::make_unique<SafetensorsFile>(path_));
    for (const auto& [name, entry] : files_[0]->tensors()) where_[name] = files_[0].get();
    return;
  }
  const json index = read_index(path_);
  const fs::path dir = target.parent_path();
  std::map<std::string, const SafetensorsFile*> by_file;
  for (const auto& [tensor, file_json] : index["weight_map"].items()) {
    if (!file_json.is_string() || !is_plain_file_name(file_json.get<std::string>())) {
      ZRT_THROW(InvalidArgument,
                "{}: weight_map['{}'] is {}: it must name a file in the index's directory", path_,
                tensor, file_json.dump());
    }
    const std::string file = file_json.get<std::string>();
    auto it = by_file.find(file);
    if (it == by_file.end()) {
      files_.push_back(std::make_unique<SafetensorsFile>((dir / file).string()));
      it = by_file.emplace(file, files_.back().get()).first;
    }
    if (it->second->tensors().count(tensor) == 0) {
      ZRT_THROW(InvalidArgument, "{}: maps tensor '{}' to {}, which does not hold it", path_,
                tensor, it->second->path());
    }
    where_[tensor] = it->second;
  }
  std::uint64_t total = 0;
  for (const auto& f : files_) {
    for (const auto& [tensor, entry] : f->tensors()) {
      const auto w = where_.find(tensor);
      if (w == where_.end()) {
        ZRT_THROW(InvalidArgument, "{}: holds tensor '{}', which the index {} does not list",
                  f->path(), tensor, path_);
      }
      if (w->second != f.get()) {
        ZRT_THROW(InvalidArgument, "{}: holds tensor '{}', which the index {} maps to {}",
                  f->path(), tensor, path_, w->second->path());
      }
      total += entry.end - entry.begin;
    }
  }
  // metadata.total_size is advisory: transformers never reads it, and other writers (mlx-lm's
  // sums whole files, headers too; some write a float) disagree with the tensors' bytes. The
  // tables above already tie every tensor to its shard, so a mismatch is only worth a note.
  if (index.contains("metadata") && index["metadata"].is_object() &&
      index["metadata"].contains("total_size")) {
    const json& t = index["metadata"]["total_size"];
    const bool equal = t.is_number() && t.get<double>() == static_cast<double>(total);
    if (!equal) {
      spdlog::info("{}: metadata.total_size is {}, the shards' tensors hold {} bytes (not used)",
                   path_, t.dump(), total);
    }
  }
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& HfWeights::file(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) ZRT_THROW(InvalidArgument, "{}: no tensor '{}'", path_, name);
  return *it->second;
}

const SafetensorsEntry& HfWeights::entry(const std::string& name) const {
  return file(name).tensors().at(name);
}

const std::string& HfWeights::file_of(const std::string& name) const {
  return file(name).path();
}

void HfWeights::read_f32(const std::string& name, std::int64_t first, std::int64_t count,
                         float* out) const {
  file(name).read_f32(name, first, count, out);
}

std::vector<float> HfWeights::read_f32(const std::string& name) const {
  return file(name).read_f32(name);
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  static const std::regex form(R"(^\s*([0-9]+(\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*$)",
                               std::regex::icase);
  std::smatch m;
  if (std::regex_match(text, m, form)) {
    std::string unit = m[3].str();
    for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    const bool binary = unit.size() == 3;
    const double base = binary ? 1024.0 : 1000.0;
    int power = 0;
    if (!unit.empty() && unit != "B")
      power = 1 + static_cast<int>(std::string("KMGT").find(unit[0]));
    const double bytes = std::stod(m[1].str()) * std::pow(base, power);
    if (bytes >= 1 && bytes < 1.8e19) return static_cast<std::uint64_t>(std::llround(bytes));
  }
  ZRT_THROW(InvalidArgument,
            "{} '{}': expected a size such as 5GB, 500MB, 2GiB or a byte count, above 0", what,
            text);
}

std::vector<std::string> write_hf_weights(const std::string& dir, const SafetensorsTensors& tensors,
                                          DType dtype, std::uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) ZRT_THROW(Error, "cannot create the folder {}: {}", dir, ec.message());
  // Group the tensors into shards in order.
  std::vector<std::vector<std::size_t>> groups(1);
  std::uint64_t in_group = 0, total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes =
        safetensors_bytes(static_cast<std::int64_t>(tensors[i].second.second.size()), dtype);
    if (!groups.back().empty() && in_group + bytes > max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += bytes;
    total += bytes;
  }
  // The new files are written whole into a folder of their own inside `dir` first, each
  // fsynced and closed; only then do they move in (renames within one file system, over
  // same-named earlier files) and do the earlier weights the new set does not name go. A failed
  // write (a full disk) thus leaves the earlier export as it was, and no partial file; a crash
  // between the renames leaves every new file whole.
  const fs::path staging = fs::path(dir) / ".zrt-export.tmp";
  fs::remove_all(staging, ec);
  if (ec) {
    ZRT_THROW(Error,
              "{}: cannot remove the staging folder an earlier export left: {}; remove it (it "
              "holds no finished export) and export again",
              staging.string(), ec.message());
  }
  fs::create_directory(staging, ec);
  if (ec) ZRT_THROW(Error, "cannot create the folder {}: {}", staging.string(), ec.message());
  struct RemoveStaging {
    const fs::path& path;
    ~RemoveStaging() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_staging{staging};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::vector<std::string> written;
  if (groups.size() == 1) {
    write_safetensors((staging / kSingleFile).string(), tensors, metadata, dtype);
    written.push_back(kSingleFile);
  } else {
    json weight_map = json::object();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string name = shard_name(g + 1, groups.size());
      SafetensorsTensors part;
      for (std::size_t i : groups[g]) {
        part.push_back(tensors[i]);
        weight_map[tensors[i].first] = name;
      }
      write_safetensors((staging / name).string(), part, metadata, dtype);
      written.push_back(name);
    }
    json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_synced_file((staging / kIndexFile).string(), index.dump(2) + "\n");
    written.push_back(kIndexFile);
  }
  fsync_path(staging.string(), /*directory=*/true);
  // The earlier export's weights, listed before the new ones move in.
  static const std::regex shard(R"(model-[0-9]+-of-[0-9]+\.safetensors)");
  std::vector<fs::path> earlier;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool weights = name == kSingleFile || name == kIndexFile || std::regex_match(name, shard);
    if (weights && std::find(written.begin(), written.end(), name) == written.end()) {
      earlier.push_back(e.path());
    }
  }
  if (ec) ZRT_THROW(Error, "{}: cannot list the folder: {}", dir, ec.message());
  // The index moves in last: a reader that finds it finds every shard it names.
  for (const std::string& name : written) {
    fs::rename(staging / name, fs::path(dir) / name, ec);
    if (ec) {
      ZRT_THROW(Error, "{}: cannot move {} into place: {}", dir, (staging / name).string(),
                ec.message());
    }
  }
  fsync_path(dir, /*directory=*/true);
  // One consistent set: no earlier single file, index or shard stays beside the new ones.
  for (const fs::path& path : earlier) {
    fs::remove(path, ec);
    if (ec) {
      ZRT_THROW(Error,
                "{}: the new weights are in place, but the earlier {} could not be removed: {}; "
                "remove it by hand (it is not part of this export)",
                dir, path.string(), ec.message());
    }
  }
  return written;
}

}  // namespace zrt::hf
