#include "models/hf/hf_export.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
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

// A model directory's tokenizer files, each read once (tokenizer.json can be tens of MB);
// null where a file is missing.
struct TokenizerFiles {
  json config;     // tokenizer_config.json
  json tokenizer;  // tokenizer.json, read only when a token is not among the config's
  fs::path source;

  explicit TokenizerFiles(const fs::path& dir) : source(dir) {
    std::error_code ec;
    if (!dir.empty() && fs::is_regular_file(dir / "tokenizer_config.json", ec)) {
      config = read_json(dir / "tokenizer_config.json");
    }
  }
  const json& tokenizer_json() {
    std::error_code ec;
    if (tokenizer.is_null() && fs::is_regular_file(source / "tokenizer.json", ec)) {
      tokenizer = read_json(source / "tokenizer.json");
    }
    return tokenizer;
  }

  // The id of the special token `name` (bos_token, eos_token, pad_token) as
  // tokenizer_config.json names it (a string, or {"content": ...} as older files write it):
  // looked up in its added_tokens_decoder, else tokenizer.json's added tokens and vocabulary.
  // Null when the tokenizer sets it to null, absent (no value) when the files do not say.
  std::optional<json> special_token_id(const std::string& name) {
    if (!config.is_object() || !config.contains(name)) return std::nullopt;
    json token = config[name];
    if (token.is_object() && token.contains("content")) token = token["content"];
    if (token.is_null()) return json(nullptr);
    if (!token.is_string()) return std::nullopt;
    const std::string text = token.get<std::string>();
    if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
      for (const auto& [id, entry] : config["added_tokens_decoder"].items()) {
        if (entry.is_object() && entry.value("content", json()) == text) {
          try {
            return json(std::stoll(id));
          } catch (const std::exception&) {
            return std::nullopt;
          }
        }
      }
    }
    const json& t = tokenizer_json();
    if (!t.is_object()) return std::nullopt;
    if (t.contains("added_tokens") && t["added_tokens"].is_array()) {
      for (const json& entry : t["added_tokens"]) {
        if (entry.is_object() && entry.value("content", json()) == text && entry.contains("id") &&
            entry["id"].is_number_integer()) {
          return entry["id"];
        }
      }
    }
    const json* vocab =
        t.contains("model") && t["model"].is_object() && t["model"].contains("vocab")
            ? &t["model"]["vocab"]
            : nullptr;
    if (vocab != nullptr && vocab->is_object() && vocab->contains(text) &&
        (*vocab)[text].is_number_integer()) {
      return (*vocab)[text];
    }
    return std::nullopt;
  }
};

// config.json's bos/eos/pad token ids where the run's config.json leaves them out: the
// tokenizer's own (so generate() stops at its end-of-turn token), and for GPT-2 an explicit
// null where the tokenizer has none and the vocabulary is smaller than GPT-2's, since
// transformers' GPT2Config would otherwise give 50256, an id the model does not have.
void fill_token_ids(json& config, const fs::path& source) {
  TokenizerFiles files(source);
  for (const std::string token : {"bos", "eos", "pad"}) {
    const std::string key = token + "_token_id";
    if (config.contains(key)) continue;
    if (const auto id = files.special_token_id(token + "_token")) {
      config[key] = *id;
      continue;
    }
    const bool gpt2_default_missing =
        token != "pad" && config.value("model_type", json()) == "gpt2" &&
        config.contains("vocab_size") && config["vocab_size"].is_number_integer() &&
        config["vocab_size"].get<std::int64_t>() <= 50256;
    if (gpt2_default_missing) config[key] = nullptr;
  }
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
  fill_token_ids(config, source);
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
