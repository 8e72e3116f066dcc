#include "models/hf/hf_export.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "models/hf/hf_config.h"
#include "models/hf/hf_weights.h"
#include "runtime/common/error.h"

namespace zrt::hf {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    default:
      return "float32";
  }
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  json doc = json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    ZRT_THROW(InvalidArgument, "{}: not a JSON object", path.string());
  }
  return doc;
}

void write_json(const fs::path& path, const json& doc) {
  std::ofstream out(path, std::ios::trunc);
  out << doc.dump(2) << "\n";
  out.flush();
  if (!out) ZRT_THROW(Error, "{}: cannot write: {}", path.string(), std::strerror(errno));
}

}  // namespace

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "tokenizer.model",
                                                 "vocab.json",
                                                 "merges.txt",
                                                 "added_tokens.json",
                                                 "chat_template.jinja"};
  return names;
}

std::vector<std::string> write_hf_directory(ExportInput input, const std::string& config_json,
                                            const std::string& init_from,
                                            const std::string& out_dir,
                                            const HfExportOptions& options) {
  std::error_code ec;
  // The directory the run started from (a model directory, or the folder of its file).
  fs::path source;
  if (!init_from.empty()) {
    source =
        fs::is_directory(init_from, ec) ? fs::path(init_from) : fs::path(init_from).parent_path();
    if (!fs::is_directory(source, ec)) source.clear();
  }
  json config = json::parse(config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    ZRT_THROW(InvalidArgument, "{}: the architecture's config.json is not a JSON object",
              input.checkpoint);
  }
  if (!source.empty() && fs::is_regular_file(source / "config.json", ec)) {
    json merged = read_json(source / "config.json");
    merged.update(config);  // the checkpoint's architecture wins; the file's other keys stay
    config = merged;
  }
  config.erase("dtype");  // transformers v5's name for torch_dtype: one of them, set below
  config["torch_dtype"] = torch_dtype_name(options.dtype);

  SafetensorsTensors tensors;
  for (ExportTensor& t : input.tensors) {
    tensors.emplace_back(t.name, std::make_pair(t.shape, std::move(t.values)));
  }
  std::vector<std::string> written =
      write_hf_weights(out_dir, tensors, options.dtype, options.max_shard_bytes);
  const fs::path out = out_dir;
  write_json(out / "config.json", config);
  written.push_back("config.json");

  json generation;
  if (!source.empty() && fs::is_regular_file(source / "generation_config.json", ec)) {
    generation = read_json(source / "generation_config.json");
  } else {
    generation["_from_model_config"] = true;
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (config.contains(key)) generation[key] = config[key];
    }
  }
  write_json(out / "generation_config.json", generation);
  written.push_back("generation_config.json");

  if (!source.empty()) {
    for (const std::string& name : tokenizer_file_names()) {
      if (!fs::is_regular_file(source / name, ec)) continue;
      fs::copy_file(source / name, out / name, fs::copy_options::overwrite_existing, ec);
      if (ec) {
        ZRT_THROW(Error, "cannot copy {} to {}: {}", (source / name).string(), out.string(),
                  ec.message());
      }
      written.push_back(name);
    }
    // transformers v5 keeps named chat templates beside the default one, one file each in
    // chat_templates/ (tokenizer.apply_chat_template(..., chat_template="tool_use")).
    const fs::path templates = source / "chat_templates";
    if (fs::is_directory(templates, ec)) {
      fs::create_directories(out / "chat_templates", ec);
      for (const auto& entry : fs::directory_iterator(templates, ec)) {
        if (!entry.is_regular_file(ec)) continue;
        const fs::path to = out / "chat_templates" / entry.path().filename();
        fs::copy_file(entry.path(), to, fs::copy_options::overwrite_existing, ec);
        if (ec) {
          ZRT_THROW(Error, "cannot copy {} to {}: {}", entry.path().string(), to.string(),
                    ec.message());
        }
        written.push_back("chat_templates/" + entry.path().filename().string());
      }
    }
  }
  return written;
}

}  // namespace zrt::hf
