#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <spdlog/spdlog.h>

#include "config/json_reader.h"
#include "config/key_table.h"
#include "runtime/common/error.h"
#include "runtime/engine/engine_parallel_dims.h"

namespace zrt {

namespace {
// model_type of `init_from`'s config.json when it is a Hugging Face model directory, else "".
// (The file is parsed fully, and checked, by the model's registry entry; here only the
// architecture is picked.)
std::string hf_model_type(const std::string& init_from) {
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::path(init_from) / "config.json";
  if (init_from.empty() || !std::filesystem::is_directory(init_from, ec) ||
      !std::filesystem::is_regular_file(file, ec)) {
    return "";
  }
  std::ifstream in(file);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_object() && doc.contains("model_type") && doc["model_type"].is_string()) {
    return doc["model_type"].get<std::string>();
  }
  return "";
}
}  // namespace

namespace {

using json = nlohmann::json;
using config::AutoRule;
using config::KeyInfo;
using config::KeyKind;
using config::KeyStatus;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& items, const char* separator = ", ") {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find(separator, begin);
    out.push_back(text.substr(begin, end - begin));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

// The value as JSON text, shortened for messages.
std::string shown(const json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

// The integer value of an integer or an integral float (5e8); false if there is none.
bool as_integer(const json& v, std::int64_t* out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
    *out = static_cast<std::int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<std::int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (!std::isfinite(x) || x != std::floor(x) || std::fabs(x) >= 9.2e18) return false;
    *out = static_cast<std::int64_t>(x);
    return true;
  }
  return false;
}

// Drops every null member (null means "the default" everywhere in a config).
json without_nulls(const json& v) {
  if (v.is_object()) {
    json out = json::object();
    for (const auto& item : v.items()) {
      if (!item.value().is_null()) out[item.key()] = without_nulls(item.value());
    }
    return out;
  }
  if (v.is_array()) {
    json out = json::array();
    for (const auto& element : v) out.push_back(without_nulls(element));
    return out;
  }
  return v;
}

// "runtime/x.cc:12: message" -> "message" (messages of the optimizers library).
std::string strip_location(const std::string& message) {
  const std::size_t colon = message.find(": ");
  if (colon == std::string::npos) return message;
  const std::string head = message.substr(0, colon);
  const std::size_t line_colon = head.rfind(':');
  if (line_colon == std::string::npos || line_colon + 1 == head.size()) return message;
  const bool digits = std::all_of(head.begin() + static_cast<std::ptrdiff_t>(line_colon) + 1,
                                  head.end(), [](char c) { return std::isdigit(c) != 0; });
  return digits ? message.substr(colon + 2) : message;
}

std::vector<std::string> choice_list(const KeyInfo& key) {
  return split(key.choices, '|');
}

// True iff `v` is the value that leaves a feature zrt does not implement switched off.
bool is_off(const KeyInfo& key, const json& v) {
  if (key.off_value[0] == '\0') return false;
  const json off = json::parse(key.off_value);
  if (key.kind == KeyKind::kOpaque) {
    if (!v.is_object()) return false;
    if (v.empty()) return true;
    if (off.empty()) return false;
    for (const auto& item : off.items()) {
      const auto it = v.find(item.key());
      if (it == v.end() || *it != item.value()) return false;
    }
    return true;
  }
  if (key.kind == KeyKind::kEnumNoCase && v.is_string() && off.is_string()) {
    return lower(v.get<std::string>()) == lower(off.get<std::string>());
  }
  return v == off;
}

// True iff "auto" is an ordinary value of the key rather than Hugging Face's placeholder.
bool auto_is_literal(const KeyInfo& key) {
  if (key.kind == KeyKind::kString) return true;
  if (key.kind != KeyKind::kEnum && key.kind != KeyKind::kEnumNoCase) return false;
  const auto choices = choice_list(key);
  return std::find(choices.begin(), choices.end(), "auto") != choices.end();
}

// Validates a document against the key table and extracts a Config from it.
//
// Every problem is recorded rather than thrown at once, so one run reports them all. After a
// problem the parser goes on with the default in place of the bad value, and marks the key
// "rejected": a rejected key reads as absent, and checks that combine it with other keys are
// skipped, so a single mistake is reported once rather than again through everything built on
// it. At the end the problems are sorted, most fundamental first (ProblemKind's order), and
// thrown as one InvalidArgument, one problem per line.
class Parser {
 public:
  Parser(const json& document, int world_size, const std::string& source,
         const std::vector<std::string>& command_line_paths)
      : world_size_(world_size),
        source_(source),
        command_line_paths_(command_line_paths.begin(), command_line_paths.end()) {
    config_.source = source;
    config_.document = document;
    if (!document.is_object()) {
      // Nothing else can be checked.
      throw InvalidArgument(
          fmt::format("{}: the config must be a JSON object, not {}", source_, shown(document)));
    }
    doc_ = without_nulls(document);
    if (doc_.contains("bfloat16")) {
      if (doc_.contains("bf16")) {
        fail("bfloat16", "give bf16 or its old name bfloat16, not both");
      } else {
        doc_["bf16"] = doc_["bfloat16"];
      }
      doc_.erase("bfloat16");
    }
  }

  Config run() {
    ConfigDraft draft = read();
    if (!draft.problems.empty()) {
      std::string message;
      for (const std::string& line : draft.problems) {
        message += (message.empty() ? "" : "\n") + line;
      }
      throw InvalidArgument(message);
    }
    return std::move(draft.config);
  }

  // Every problem, sorted (the most fundamental first), with the config as read.
  ConfigDraft read() {
    reject_parameters_of_unsupported_types();
    walk(doc_, "");
    read_sequence_parallel();
    read_batch();
    read_precision();
    read_expert_parallel();
    read_zero();
    read_run_blocks();  // model, data, train, seed, output_dir, log_level
    read_optimizer_and_scheduler();
    read_checkpoint();
    read_monitors();
    read_device_comm_trace();
    std::stable_sort(errors_.begin(), errors_.end(),
                     [](const Problem& a, const Problem& b) { return a.kind < b.kind; });
    ConfigDraft draft;
    for (const Problem& e : errors_) {
      draft.problems.push_back(e.line);
      draft.problem_keys.push_back(e.key);
    }
    draft.config = std::move(config_);
    return draft;
  }

 private:
  struct Problem {
    ProblemKind kind;
    std::string line;  // "run.json: zero_optimization.stge: unknown key; ..."
    std::string key;   // the key path it is about ("" for none): ConfigDraft::problem_keys
  };

  // True iff the value at `path` (or an enclosing block) came from a command-line override.
  bool from_command_line(const std::string& path) const {
    for (std::size_t dot = path.find('.'); dot != std::string::npos;
         dot = path.find('.', dot + 1)) {
      if (command_line_paths_.count(path.substr(0, dot)) != 0) return true;
    }
    return command_line_paths_.count(path) != 0;
  }
  // "run.json: <path>: message", or "--<path>: message" for a value from the command line.
  std::string located(const std::string& path, const std::string& message) const {
    if (from_command_line(path)) return fmt::format("--{}: {}", path, message);
    return fmt::format("{}: {}: {}", source_, path, message);
  }
  void error(ProblemKind kind, const std::string& path, const std::string& message) {
    errors_.push_back({kind, located(path, message), path});
  }
  // A message that names its keys itself; `path`, the key it is about, also decides where the
  // value came from.
  void error_plain(ProblemKind kind, const std::string& message, const std::string& path = "") {
    const bool command_line = !path.empty() && from_command_line(path);
    errors_.push_back({kind,
                       command_line ? fmt::format("--{}: {}", path, message)
                                    : fmt::format("{}: {}", source_, message),
                       path});
  }
  // Problems found while reading the values (combinations, mostly): reported after the
  // problems of single keys. `about`: the key it concerns (ConfigDraft::problem_keys), which
  // does not change where the message says the value came from.
  void fail_plain(const std::string& message, const std::string& about = "") {
    errors_.push_back({ProblemKind::kConflict, fmt::format("{}: {}", source_, message), about});
  }
  void fail(const std::string& path, const std::string& message) {
    error(ProblemKind::kConflict, path, message);
  }
  void warn(const std::string& path, const std::string& message) {
    spdlog::warn("{}: {}: {}", source_, path, message);
    config_.warnings.push_back(path + ": " + message);
  }

  // A key whose value is not usable: it reads as absent from now on.
  void reject(const std::string& path) { rejected_.insert(path); }
  bool is_rejected(const std::string& path) const {
    for (std::size_t dot = path.find('.'); dot != std::string::npos;
         dot = path.find('.', dot + 1)) {
      if (rejected_.count(path.substr(0, dot)) != 0) return true;
    }
    return rejected_.count(path) != 0;
  }
  bool any_rejected(std::initializer_list<const char*> paths) const {
    return std::any_of(paths.begin(), paths.end(),
                       [&](const char* path) { return is_rejected(path); });
  }

  // An optimizer or schedule zrt does not have is the one problem worth reporting about its
  // block: its parameters (Lamb's max_coeff, OneCycle's cycle_min_lr) are not in the key table
  // and would each read as an unknown key. Checked before the walk for that reason.
  void reject_parameters_of_unsupported_types() {
    const std::pair<const char*, std::string (*)(const std::string&)> blocks[] = {
        {"optimizer", &unsupported_optimizer_type}, {"scheduler", &unsupported_scheduler_type}};
    for (const auto& [block, unsupported] : blocks) {
      const std::string type_path = std::string(block) + ".type";
      const json* type = find(type_path);
      if (type == nullptr) continue;
      if (!type->is_string()) {  // the walk reports its form
        reject(std::string(block) + ".params");
        continue;
      }
      const std::string why = unsupported(type->get<std::string>());
      if (why.empty()) continue;
      error_plain(ProblemKind::kUnsupported, why, type_path);
      reject(type_path);
      reject(std::string(block) + ".params");
    }
  }

  // ---- Pass 1: every key against the table ----

  void walk(const json& object, const std::string& prefix) {
    for (const auto& item : object.items()) {
      const std::string path = join_path(prefix, item.key());
      if (is_rejected(path)) continue;  // reported already (an unsupported type's params)
      const KeyInfo* key = config::find_key(path);
      if (key == nullptr) {
        unknown_key(path, prefix, item.key());
        continue;
      }
      check(*key, item.value(), path);
    }
  }

  void unknown_key(const std::string& path, const std::string& prefix, const std::string& name) {
    reject(path);
    // The key the user probably meant counts as given but unusable, so that what depends on it
    // (the batch rule, required keys, combinations) is not reported as well.
    const auto meant = [&](const std::string& intended) {
      if (find(intended) == nullptr) reject(intended);
    };
    // Another framework's name for a zrt setting, written from habit: zrt's key, and why.
    if (const config::ForeignKey* foreign = config::find_foreign_key(name)) {
      meant(foreign->path);
      error(ProblemKind::kUnknownKey, path,
            fmt::format("unknown key; did you mean '{}'? ({} {})", foreign->path, name,
                        foreign->origin));
      return;
    }
    const std::vector<std::string> siblings = config::child_keys(prefix);
    const std::string guess = detail::closest_match(name, siblings);
    if (!guess.empty()) {
      meant(join_path(prefix, guess));
      error(ProblemKind::kUnknownKey, path, fmt::format("unknown key; did you mean '{}'?", guess));
      return;
    }
    // The right key in the wrong block ("stage" at the top level), if only one block has it.
    std::vector<std::string> elsewhere;
    for (const KeyInfo& key : config::key_table()) {
      const std::string other = key.path;
      const std::size_t dot = other.rfind('.');
      // Also a top-level key put in a block ("zero_optimization.sequence_parallel_size").
      const bool same_name = dot != std::string::npos ? other.substr(dot + 1) == name
                                                      : !prefix.empty() && other == name;
      if (same_name) elsewhere.push_back(other);
    }
    if (elsewhere.size() == 1) {
      meant(elsewhere.front());
      error(ProblemKind::kUnknownKey, path,
            fmt::format("unknown key; did you mean '{}'?", elsewhere.front()));
    } else if (siblings.size() <= 12) {
      error(ProblemKind::kUnknownKey, path,
            fmt::format("unknown key; valid keys: {}", join(siblings)));
    } else {
      error(ProblemKind::kUnknownKey, path,
            "unknown key (docs/config-keys.md lists the valid keys)");
    }
  }

  void check(const KeyInfo& key, const json& v, const std::string& path) {
    if (is_auto(v) && !auto_is_literal(key)) {
      if (key.auto_rule != AutoRule::kNone) return;  // resolved when the value is read
      reject(path);
      error(ProblemKind::kBadValue, path,
            fmt::format("\"auto\" is filled in by Hugging Face's Trainer and has no "
                        "meaning in zrt here; expected {}",
                        config::expected_form(key)));
      return;
    }
    if (key.status == KeyStatus::kUnsupportedError) {
      if (is_off(key, v)) return;
      const std::string off = key.off_value;
      std::string fix = "remove the key";
      if (key.kind == KeyKind::kOpaque && off.find("enabled") != std::string::npos) {
        fix = "remove the block or set \"enabled\": false";
      } else if (key.kind == KeyKind::kOpaque && off.find("deepcompile") != std::string::npos) {
        fix = "remove the block or set \"deepcompile\": false";
      } else if (key.kind != KeyKind::kOpaque && !off.empty()) {
        fix = fmt::format("remove the key or set it to {}", off);
      }
      reject(path);
      error(ProblemKind::kUnsupported, path,
            fmt::format("not implemented by zrt ({}); {}", key.meaning, fix));
      return;
    }
    if (!check_form(key, v, path)) {
      reject(path);
      return;
    }
    if (key.kind == KeyKind::kObject) {
      walk(v, path);
      return;
    }
    if (key.status == KeyStatus::kAcceptedWithWarning && !is_off(key, v)) {
      warn(path, fmt::format("accepted, but has no effect in zrt ({})", key.meaning));
    }
  }

  // Records that `v` does not have the key's form; returns false, for check_form.
  bool wrong_form(const KeyInfo& key, const json& v, const std::string& path) {
    std::string hint;
    if (key.kind == KeyKind::kEnum && v.is_string()) {
      for (const std::string& choice : choice_list(key)) {  // "CPU" for "cpu"
        if (lower(choice) == lower(v.get<std::string>())) {
          hint = fmt::format("; did you mean \"{}\"?", choice);
        }
      }
    }
    error(ProblemKind::kBadValue, path,
          fmt::format("expected {}, got {}{}", config::expected_form(key), shown(v), hint));
    return false;
  }

  bool check_range(const KeyInfo& key, const json& element, const json& v,
                   const std::string& path) {
    const double x = element.get<double>();
    if ((!std::isnan(key.min) && x < key.min) || (!std::isnan(key.max) && x > key.max)) {
      error(ProblemKind::kBadValue, path,
            fmt::format("{} is out of range; expected {}", shown(v), config::expected_form(key)));
      return false;
    }
    return true;
  }

  // True iff `v` has the key's form and range; otherwise records the problem.
  bool check_form(const KeyInfo& key, const json& v, const std::string& path) {
    std::int64_t integer = 0;
    switch (key.kind) {
      case KeyKind::kObject:
      case KeyKind::kOpaque:
        return v.is_object() || wrong_form(key, v, path);
      case KeyKind::kBool:
        return v.is_boolean() || wrong_form(key, v, path);
      case KeyKind::kInt:
        if (!as_integer(v, &integer)) return wrong_form(key, v, path);
        return check_range(key, v, v, path);
      case KeyKind::kNumber:
        if (!v.is_number() || !std::isfinite(v.get<double>())) return wrong_form(key, v, path);
        return check_range(key, v, v, path);
      case KeyKind::kString:
        return v.is_string() || wrong_form(key, v, path);
      case KeyKind::kEnum:
      case KeyKind::kEnumNoCase: {
        if (!v.is_string()) return wrong_form(key, v, path);
        const bool no_case = key.kind == KeyKind::kEnumNoCase;
        const std::string s = no_case ? lower(v.get<std::string>()) : v.get<std::string>();
        for (const std::string& choice : choice_list(key)) {
          if ((no_case ? lower(choice) : choice) == s) return true;
        }
        return wrong_form(key, v, path);
      }
      case KeyKind::kNumberPair:
      case KeyKind::kIntPair: {
        if (!v.is_array() || v.size() != 2) return wrong_form(key, v, path);
        for (const json& element : v) {
          const bool ok = key.kind == KeyKind::kIntPair
                              ? as_integer(element, &integer)
                              : element.is_number() && std::isfinite(element.get<double>());
          if (!ok) return wrong_form(key, v, path);
          if (!check_range(key, element, v, path)) return false;
        }
        return true;
      }
      case KeyKind::kStringList:
        if (!v.is_array()) return wrong_form(key, v, path);
        for (const json& element : v) {
          if (!element.is_string()) return wrong_form(key, v, path);
        }
        return true;
      case KeyKind::kIntList:
        if (!v.is_array()) return wrong_form(key, v, path);
        for (const json& element : v) {
          if (!as_integer(element, &integer)) return wrong_form(key, v, path);
          if (!check_range(key, element, v, path)) return false;
        }
        return true;
    }
    return true;
  }

  // ---- Pass 2: typed reads (the values have their form; "auto" and absent read as unset) ----

  const json* find(const std::string& path) const {
    const json* node = &doc_;
    for (const std::string& part : split(path, '.')) {
      if (!node->is_object()) return nullptr;
      const auto it = node->find(part);
      if (it == node->end()) return nullptr;
      node = &*it;
    }
    return node;
  }
  // The value at `path`, or nullptr if it is absent, rejected or "auto" (for a key with an auto
  // rule).
  const json* value(const std::string& path) const {
    if (is_rejected(path)) return nullptr;
    const json* v = find(path);
    if (v == nullptr) return nullptr;
    const KeyInfo* key = config::find_key(path);
    if (is_auto(*v) && key != nullptr && !auto_is_literal(*key)) return nullptr;
    return v;
  }
  bool has(const std::string& path) const { return value(path) != nullptr; }

  std::optional<std::int64_t> get_int(const std::string& path) const {
    const json* v = value(path);
    if (v == nullptr) return std::nullopt;
    std::int64_t out = 0;
    as_integer(*v, &out);
    return out;
  }
  std::int64_t get_int(const std::string& path, std::int64_t fallback) const {
    return get_int(path).value_or(fallback);
  }
  int get_small_int(const std::string& path, int fallback) {
    const std::int64_t x = get_int(path, fallback);
    if (x > std::numeric_limits<int>::max() || x < std::numeric_limits<int>::min()) {
      error(ProblemKind::kBadValue, path, fmt::format("{} is too large", x));
      reject(path);
      return fallback;
    }
    return static_cast<int>(x);
  }
  double get_number(const std::string& path, double fallback) const {
    const json* v = value(path);
    return v == nullptr ? fallback : v->get<double>();
  }
  bool get_bool(const std::string& path, bool fallback) const {
    const json* v = value(path);
    return v == nullptr ? fallback : v->get<bool>();
  }
  std::string get_string(const std::string& path, const std::string& fallback) const {
    const json* v = value(path);
    return v == nullptr ? fallback : v->get<std::string>();
  }
  // A kStringList key's strings (empty when absent); an empty string is an error at its index.
  std::vector<std::string> get_string_list(const std::string& path) {
    std::vector<std::string> out;
    const json* v = value(path);
    if (v == nullptr) return out;
    for (std::size_t i = 0; i < v->size(); ++i) {
      out.push_back((*v)[i].get<std::string>());
      if (out.back().empty()) {
        error(ProblemKind::kBadValue, fmt::format("{}[{}]", path, i),
              "an empty pattern matches no parameter");
      }
    }
    return out;
  }

  // sequence_parallel_size, before the batch rule that counts world / sp (validate() checks it
  // against the world, read_device_comm_trace against comm.ranks_per_node).
  void read_sequence_parallel() {
    if (!has("sequence_parallel_size") || is_rejected("sequence_parallel_size")) return;
    config_.engine.sequence_parallel_size = get_small_int("sequence_parallel_size", 1);
  }

  void read_batch() {
    BatchConfig& b = config_.batch;
    // Placeholders for a run that will not start (every path below that records a problem
    // leaves them), consistent so that nothing later trips over them.
    b.world_size = world_size_ > 0 ? world_size_ : 1;
    b.micro_batch_size = 1;
    b.gradient_accumulation_steps = 1;
    b.train_batch_size = b.world_size;
    config_.engine.gradient_accumulation_steps = 1;
    // A batch key already reported (a bad value, or the key a typo meant): solving the rule
    // without it would report a batch problem the user did not make.
    if (any_rejected({"train_batch_size", "train_micro_batch_size_per_gpu",
                      "gradient_accumulation_steps"})) {
      return;
    }
    const auto train = get_int("train_batch_size");
    const auto micro = get_int("train_micro_batch_size_per_gpu");
    const auto accum = get_int("gradient_accumulation_steps");
    // The rule multiplies these: keep every product far from int64's limit (2^62 samples).
    const std::int64_t kLargestBatchKey = std::int64_t{1} << 20;
    for (const auto& [key, given] : {std::pair{"train_micro_batch_size_per_gpu", micro},
                                     std::pair{"gradient_accumulation_steps", accum}}) {
      if (given && *given > kLargestBatchKey) {
        error(ProblemKind::kBadValue, key,
              fmt::format("{} is too large (at most {})", *given, kLargestBatchKey));
        return;
      }
    }
    // DeepSpeed's rule counts data-parallel ranks: with sequence parallelism, world / sp (the
    // sp ranks of a group read the same sequences).
    const int sp = config_.engine.sequence_parallel_size;
    if (sp < 1 || (world_size_ > 0 && world_size_ % sp != 0)) return;  // validate() says why
    std::int64_t world = world_size_ > 0 ? world_size_ / sp : world_size_;
    const auto ranks = [&](std::int64_t dp) {
      return sp == 1 ? fmt::format("world {}", dp)
                     : fmt::format("data-parallel degree {} (world {} / sequence_parallel_size {})",
                                   dp, dp * sp, sp);
    };
    // "set train_batch_size to a multiple of d (8 or 12)": the values either side that fit.
    const auto multiples_fix = [](std::int64_t given, std::int64_t d) {
      const std::int64_t below = given - given % d;
      return fmt::format("; set train_batch_size to a multiple of {} ({}{})", d,
                         below > 0 ? fmt::format("{} or ", below) : std::string(), below + d);
    };
    if (world <= 0) {
      if (!train || !micro || !accum) {
        fail_plain(
            "without a world size, train_batch_size, train_micro_batch_size_per_gpu and "
            "gradient_accumulation_steps must all be numbers (the world size is their "
            "quotient)",
            "train_batch_size");
        return;
      }
      if (*train % (*micro * *accum) != 0) {
        fail_plain(
            fmt::format("train_batch_size {} is not a multiple of micro {} × accumulation {} = {}",
                        *train, *micro, *accum, *micro * *accum),
            "train_batch_size");
        return;
      }
      world = *train / (*micro * *accum);
    }
    if (train && micro && accum) {
      if (*train != *micro * *accum * world) {
        // The numbers are usually another rank count's: say which value of each fits this one.
        std::string fixes = fmt::format("set train_batch_size {}", *micro * *accum * world);
        if (*train % (*micro * world) == 0) {
          fixes += fmt::format(", or gradient_accumulation_steps {}", *train / (*micro * world));
        }
        if (*train % (*accum * world) == 0) {
          fixes += fmt::format(", or train_micro_batch_size_per_gpu {}", *train / (*accum * world));
        }
        fail_plain(
            fmt::format(
                "train_batch_size {} is not micro {} × accumulation {} × {} = {}: {}, or leave one "
                "of the three out to have it derived",
                *train, *micro, *accum, ranks(world), *micro * *accum * world, fixes),
            "train_batch_size");
        return;
      }
      b.train_batch_size = *train;
      b.micro_batch_size = *micro;
      b.gradient_accumulation_steps = static_cast<int>(*accum);
    } else if (train && micro) {
      const std::int64_t d = *micro * world;
      if (*train % d != 0) {
        error_plain(ProblemKind::kConflict,
                    fmt::format("train_batch_size {} is not divisible by micro {} × {} = {}{}",
                                *train, *micro, ranks(world), d, multiples_fix(*train, d)),
                    "train_batch_size");
        return;
      }
      b.train_batch_size = *train;
      b.micro_batch_size = *micro;
      b.gradient_accumulation_steps = static_cast<int>(*train / d);
    } else if (train && accum) {
      const std::int64_t d = *accum * world;
      if (*train % d != 0) {
        error_plain(
            ProblemKind::kConflict,
            fmt::format("train_batch_size {} is not divisible by accumulation {} × {} = {}{}",
                        *train, *accum, ranks(world), d, multiples_fix(*train, d)),
            "train_batch_size");
        return;
      }
      b.train_batch_size = *train;
      b.micro_batch_size = *train / d;
      b.gradient_accumulation_steps = static_cast<int>(*accum);
    } else if (micro && accum) {
      b.train_batch_size = *micro * *accum * world;
      b.micro_batch_size = *micro;
      b.gradient_accumulation_steps = static_cast<int>(*accum);
    } else if (train) {
      if (*train % world != 0) {
        error_plain(ProblemKind::kConflict,
                    fmt::format("train_batch_size {} is not divisible by {}{}", *train,
                                ranks(world), multiples_fix(*train, world)),
                    "train_batch_size");
        return;
      }
      b.train_batch_size = *train;
      b.micro_batch_size = *train / world;
      b.gradient_accumulation_steps = 1;
    } else if (micro) {
      b.train_batch_size = *micro * world;
      b.micro_batch_size = *micro;
      b.gradient_accumulation_steps = 1;
    } else {
      fail_plain(
          "no batch size: give train_batch_size or train_micro_batch_size_per_gpu as a number "
          "(\"auto\" counts as not given)",
          "train_batch_size");
      b.train_batch_size = b.world_size;
      return;
    }
    if (accum && *accum > std::numeric_limits<int>::max()) {
      error(ProblemKind::kBadValue, "gradient_accumulation_steps",
            fmt::format("{} is too large", *accum));
      b.gradient_accumulation_steps = 1;
      return;
    }
    b.world_size = static_cast<int>(world * sp);
    config_.engine.gradient_accumulation_steps = b.gradient_accumulation_steps;
  }

  void read_precision() {
    const bool fp16 = get_bool("fp16.enabled", false);
    const bool bf16 = get_bool("bf16.enabled", false);
    if (fp16 && bf16) {
      fail_plain("fp16.enabled and bf16.enabled are both true; choose one", "bf16.enabled");
      reject("bf16.enabled");  // the compute dtype is unknown: no rule that reads it applies
    }
    EngineOptions& e = config_.engine;
    e.compute_dtype = fp16 ? DType::kFloat16 : bf16 ? DType::kBFloat16 : DType::kFloat32;
    if (has("communication_data_type")) {
      e.communication_dtype = parse_dtype(get_string("communication_data_type", ""));
    }
    if (has("data_types.grad_accum_dtype")) {
      e.grad_accum_dtype = parse_dtype(get_string("data_types.grad_accum_dtype", ""));
    }
    e.gradient_clipping = get_number("gradient_clipping", e.gradient_clipping);

    LossScaleOptions& s = e.loss_scale;
    s.loss_scale = get_number("fp16.loss_scale", s.loss_scale);
    s.initial_scale_power = get_small_int("fp16.initial_scale_power", s.initial_scale_power);
    s.loss_scale_window = get_small_int("fp16.loss_scale_window", s.loss_scale_window);
    s.hysteresis = get_small_int("fp16.hysteresis", s.hysteresis);
    s.consecutive_hysteresis = get_bool("fp16.consecutive_hysteresis", s.consecutive_hysteresis);
    s.min_loss_scale = get_number("fp16.min_loss_scale", s.min_loss_scale);
    if (!(s.min_loss_scale > 0)) {
      error(ProblemKind::kBadValue, "fp16.min_loss_scale", "must be > 0");
      reject("fp16.min_loss_scale");
      s.min_loss_scale = LossScaleOptions().min_loss_scale;
    }
    const double initial = std::ldexp(1.0, s.initial_scale_power);
    if (fp16 && s.loss_scale == 0 && s.min_loss_scale > initial &&
        !any_rejected({"fp16.loss_scale", "fp16.initial_scale_power", "fp16.min_loss_scale"})) {
      fail("fp16.min_loss_scale", fmt::format("{} exceeds the initial scale 2^{} = {}",
                                              s.min_loss_scale, s.initial_scale_power, initial));
    }
  }

  OffloadConfig read_offload(const std::string& path, int default_buffer_count) {
    OffloadConfig o;
    o.buffer_count = default_buffer_count;
    const std::string device = get_string(path + ".device", "none");
    o.device = device == "cpu"    ? OffloadDevice::kCpu
               : device == "nvme" ? OffloadDevice::kNvme
                                  : OffloadDevice::kNone;
    o.nvme_path = get_string(path + ".nvme_path", "");
    o.pin_memory = get_bool(path + ".pin_memory", o.pin_memory);
    o.buffer_count = get_small_int(path + ".buffer_count", default_buffer_count);
    o.buffer_size = get_int(path + ".buffer_size", o.buffer_size);
    o.max_in_cpu = get_int(path + ".max_in_cpu", o.max_in_cpu);
    o.ratio = get_number(path + ".ratio", o.ratio);
    if (o.device == OffloadDevice::kNvme) {
      error(ProblemKind::kUnsupported, path + ".device",
            "nvme offload is not implemented; use \"cpu\"");
      reject(path + ".device");
      o.device = OffloadDevice::kNone;
      return o;
    }
    if (!o.nvme_path.empty()) {
      warn(path + ".nvme_path", fmt::format("ignored: device is {}", device));
    }
    return o;
  }

  // DeepSpeed's expert_parallel section (AutoEP): the layout keys into the engine options (its
  // validate() checks autoep_size against the world and the stage), the model-description keys
  // checked against what zrt's mixture-of-experts models are (the table refuses the others).
  void read_expert_parallel() {
    EngineOptions& e = config_.engine;
    const std::string x = "expert_parallel.";
    e.data_before_expert_parallel = get_bool("use_data_before_expert_parallelism", false);
    const bool enabled = get_bool(x + "enabled", false);
    if (!enabled) {
      if (has(x + "autoep_size"))
        warn(x + "autoep_size", "ignored: expert_parallel.enabled is false");
      return;
    }
    e.expert_parallel_size = static_cast<int>(
        std::min<std::int64_t>(get_int(x + "autoep_size", 1), std::numeric_limits<int>::max()));
    if (!has(x + "autoep_size")) {
      warn(x + "autoep_size",
           "not given: 1, so every rank holds every expert, as without the block; set it to the "
           "number of ranks the experts are split over");
    }
    const std::string hf_type = hf_model_type(get_string("model.init_from", ""));
    const std::string type = get_string("model.type", hf_type.empty() ? "gpt2" : hf_type);
    const bool dense = type == "gpt2" || type == "llama" || type == "qwen2" || type == "qwen3" ||
                       type == "mistral";
    if (dense && !is_rejected("model.type")) {
      fail(x + "enabled",
           fmt::format("model.type {} has no mixture-of-experts layers: expert parallelism "
                       "splits experts (Mixtral, Qwen2-MoE, Qwen3-MoE); remove the "
                       "expert_parallel block or set enabled false",
                       type));
    }
    const std::string preset = get_string(x + "preset_model", "");
    if (preset == "deepseek_v2" || preset == "deepseek_v3" || preset == "llama4" ||
        preset == "qwen3_5_moe") {
      fail(x + "preset_model",
           fmt::format("zrt has no {} model; its mixture-of-experts models are Mixtral "
                       "(preset_model mixtral) and Qwen2/3-MoE (qwen3_moe), or leave the key out",
                       preset));
    } else if (!preset.empty() && !dense) {
      const bool qwen = type.find("qwen") != std::string::npos;
      const bool mixtral = type.find("mixtral") != std::string::npos;
      if ((preset == "mixtral" && qwen) || (preset == "qwen3_moe" && mixtral)) {
        fail(x + "preset_model",
             fmt::format("{} names another family than model.type {}; give the model's own "
                         "(mixtral for Mixtral, qwen3_moe for Qwen2/3-MoE) or leave the key out",
                         preset, type));
      }
    }
    if (get_string(x + "score_func", "auto") == "sigmoid") {
      fail(x + "score_func",
           "sigmoid scoring is DeepSeek-V3's and Llama 4's router; Mixtral and Qwen2/3-MoE route "
           "with a softmax, which zrt's models compute as transformers does; use auto or softmax");
    }
    if (get_string(x + "score_apply", "auto") == "pre") {
      fail(x + "score_apply",
           "transformers' Mixtral and Qwen MoE weight the experts' outputs (post); pre would "
           "scale their inputs and change the model; use auto or post");
    }
  }

  // zero_optimization.zero_hpz_partition_size as given (validate() checks it against the stage,
  // MiCS and the world; see normalize_groups for 1 and the whole world).
  void read_hpz() {
    const std::string key = "zero_optimization.zero_hpz_partition_size";
    if (!has(key) || is_rejected(key)) return;
    const std::int64_t size = get_int(key, 1);
    if (size > 1) {
      config_.engine.hpz_partition_size =
          static_cast<int>(std::min<std::int64_t>(size, std::numeric_limits<int>::max()));
    }
  }

  // After validation: a MiCS shard group or an hpZ group of the whole world is the plain layout
  // (the secondary shard would be the primary one, every gather would still span all ranks).
  void normalize_groups(bool hpz_problem) {
    EngineOptions& e = config_.engine;
    const std::int64_t world = config_.batch.world_size;
    if (e.mics_shard_size >= world) e.mics_shard_size = 0;
    if (e.hpz_partition_size > 1 && e.hpz_partition_size == world && !hpz_problem) {
      warn("zero_optimization.zero_hpz_partition_size",
           fmt::format("{} is the whole world: the secondary shard would be the primary "
                       "one and every gather would still span all ranks; hpZ is off",
                       e.hpz_partition_size));
      e.hpz_partition_size = 0;
    }
  }

  void read_zero() {
    EngineOptions& e = config_.engine;
    const std::string z = "zero_optimization.";
    e.stage = get_small_int(z + "stage", e.stage);
    e.reduce_bucket_size = get_int(z + "reduce_bucket_size", e.reduce_bucket_size);
    e.stage3_prefetch_bucket_size =
        get_int(z + "stage3_prefetch_bucket_size", e.stage3_prefetch_bucket_size);
    e.stage3_param_persistence_threshold =
        get_int(z + "stage3_param_persistence_threshold", e.stage3_param_persistence_threshold);
    e.stage3_max_live_parameters =
        get_int(z + "stage3_max_live_parameters", e.stage3_max_live_parameters);
    e.stage3_max_reuse_distance =
        get_int(z + "stage3_max_reuse_distance", e.stage3_max_reuse_distance);
    e.overlap_comm = get_bool(z + "overlap_comm", e.overlap_comm);
    const bool stage_known = !is_rejected(z + "stage");
    e.quantized_weights = get_bool(z + "zero_quantized_weights", e.quantized_weights);
    e.quantized_gradients = get_bool(z + "zero_quantized_gradients", e.quantized_gradients);
    if (has(z + "mics_shard_size") && !is_rejected(z + "mics_shard_size")) {
      const std::int64_t shards = get_int(z + "mics_shard_size", -1);
      if (shards == 0) {
        fail(z + "mics_shard_size",
             "0 is not a group size; give the ranks per shard group, or -1 "
             "to shard over every rank");
      } else if (shards > 0 && (shards != config_.batch.world_size || e.stage == 0)) {
        // A group of the whole world is the plain layout, except at stage 0, which has no
        // shards to group (validate() says so).
        e.mics_shard_size =
            static_cast<int>(std::min<std::int64_t>(shards, std::numeric_limits<int>::max()));
      }
    }
    read_hpz();
    if (e.stage < 3 && stage_known) {
      for (const char* key : {"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                              "stage3_max_live_parameters", "stage3_max_reuse_distance"}) {
        if (has(z + key)) {
          warn(z + key, fmt::format("only used at stage 3 (stage is {})", e.stage));
        }
      }
    }
    config_.offload_optimizer = read_offload(z + "offload_optimizer", 4);
    config_.offload_optimizer.split_step = get_string(z + "offload_optimizer.split_step", "auto");
    config_.offload_param = read_offload(z + "offload_param", 5);
    const std::string ratio_key = z + "offload_optimizer.ratio";
    if (config_.offload_optimizer.ratio < 1.0 && !is_rejected(ratio_key) &&
        !config_.offload_optimizer.enabled() && !is_rejected(z + "offload_optimizer.device")) {
      warn(ratio_key, "ignored: offload_optimizer.device is none");
    }
    e.offload_optimizer.enabled = config_.offload_optimizer.enabled();
    e.offload_optimizer.pin_memory = config_.offload_optimizer.pin_memory;
    e.offload_optimizer.ratio = config_.offload_optimizer.ratio;
    e.offload_split_step = config_.offload_optimizer.split_step == "on" ? OffloadSplitStep::kOn
                           : config_.offload_optimizer.split_step == "off"
                               ? OffloadSplitStep::kOff
                               : OffloadSplitStep::kAuto;
    e.offload_param.enabled = config_.offload_param.enabled();
    e.offload_param.pin_memory = config_.offload_param.pin_memory;
    report_engine_problems();
  }

  // The engine's own rules (engine_options.h's validate(), which the engine and zrt-mem run
  // too), reported at their keys; a rule that reads a key already reported is left out.
  void report_engine_problems() {
    bool hpz_problem = false;
    for (const OptionProblem& problem : validate(config_.engine, config_.batch.world_size)) {
      const bool read_rejected =
          is_rejected(problem.key) ||
          std::any_of(problem.also.begin(), problem.also.end(),
                      [&](const std::string& key) { return is_rejected(key); });
      if (read_rejected) continue;
      hpz_problem = hpz_problem || problem.key == "zero_optimization.zero_hpz_partition_size";
      fail(problem.key, problem.message);
    }
    normalize_groups(hpz_problem);
  }

  // Where the run's layout puts the experts' groups (ParallelDims, as zrt-train's layout and
  // zrt-mem place them: in MiCS and hpZ blocks, ZeRO++'s nodes), reported at their keys now
  // rather than when every rank builds its groups; a key already refused is left out.
  void report_expert_placement() {
    const std::int64_t world = config_.batch.world_size;
    if (world <= 0 || world > std::numeric_limits<int>::max()) return;
    const ParallelDims dims =
        parallel_dims(config_.engine, static_cast<int>(world), config_.comm.ranks_per_node);
    for (const ParallelDims::KeyedProblem& problem : dims.expert_placement_problems()) {
      if (!is_rejected(problem.key)) fail(problem.key, problem.message);
    }
  }

  // The model block's dimensions. Each type has its own keys (GPT-2's n_layer/n_head/n_embd,
  // the Llama family's config.json names); vocab_size and seq_len are shared. A key of another
  // type is an error naming it; the registry's entry validates the values.
  void read_model_keys(ModelConfig& m, bool dimensions_from_hf) {
    const bool gpt = m.type == "gpt2";
    const char* gpt_only[] = {"n_layer", "n_head", "n_embd"};
    const char* llama_only[] = {"hidden_size",
                                "intermediate_size",
                                "num_hidden_layers",
                                "num_attention_heads",
                                "num_key_value_heads",
                                "head_dim",
                                "max_position_embeddings",
                                "sliding_window",
                                "max_window_layers",
                                "rms_norm_eps",
                                "rope_theta",
                                "rope_scaling",
                                "tie_word_embeddings",
                                "attention_bias"};
    const bool moe = m.type == "mixtral" || m.type == "qwen2_moe" || m.type == "qwen3_moe";
    const char* moe_only[] = {"num_experts",           "num_experts_per_tok",
                              "moe_intermediate_size", "shared_expert_intermediate_size",
                              "norm_topk_prob",        "decoder_sparse_step",
                              "mlp_only_layers",       "router_aux_loss_coef",
                              "router_z_loss_coef",    "capacity_factor"};
    // Qwen2's first windowed layer: the mixtures of experts window every layer or none (Qwen2-MoE's
    // alternating window is refused), and the model's own parser is not reached with init_from.
    if (moe && has("model.max_window_layers")) {
      fail("model.max_window_layers",
           fmt::format("is not a key of model.type {} (it is Qwen2's and Qwen3's, model.type "
                       "qwen2 / qwen3: the "
                       "mixtures of experts take a window on every layer, model.sliding_window)",
                       m.type));
    }
    if (!moe) {
      for (const char* name : moe_only) {
        const std::string path = std::string("model.") + name;
        if (has(path)) {
          fail(path, fmt::format("is not a key of model.type {} (it is a mixture-of-experts key: "
                                 "mixtral, qwen2_moe, qwen3_moe)",
                                 m.type));
        }
      }
    }
    const std::vector<const char*> foreign =
        gpt ? std::vector<const char*>(std::begin(llama_only), std::end(llama_only))
            : std::vector<const char*>(std::begin(gpt_only), std::end(gpt_only));
    for (const char* name : foreign) {
      const std::string path = std::string("model.") + name;
      if (has(path)) {
        fail(path, fmt::format("is not a key of model.type {} ({})", m.type,
                               gpt ? "it is a Llama-family key: llama, qwen2, qwen3, mistral"
                                   : "it is a GPT-2 key; the Llama family uses hidden_size, "
                                     "num_hidden_layers, num_attention_heads"));
      }
    }
    auto read_int = [&](const char* name, std::optional<int>* field) {
      const std::string path = std::string("model.") + name;
      if (has(path)) *field = get_small_int(path, 0);
    };
    auto read_number = [&](const char* name, std::optional<double>* field) {
      const std::string path = std::string("model.") + name;
      if (has(path)) *field = get_number(path, 0.0);
    };
    auto read_bool = [&](const char* name, std::optional<bool>* field) {
      const std::string path = std::string("model.") + name;
      if (has(path)) *field = get_bool(path, false);
    };
    read_int("vocab_size", &m.vocab_size);
    read_int("seq_len", &m.seq_len);
    if (gpt) {
      const std::pair<const char*, std::optional<int>*> dims[] = {{"n_layer", &m.n_layer},
                                                                  {"n_head", &m.n_head},
                                                                  {"n_embd", &m.n_embd},
                                                                  {"vocab_size", &m.vocab_size},
                                                                  {"seq_len", &m.seq_len}};
      std::vector<std::string> missing;
      for (const auto& [name, field] : dims) {
        read_int(name, field);
        const std::string path = std::string("model.") + name;
        if (!field->has_value() && !is_rejected(path)) missing.push_back(name);
      }
      if (has("model") && m.preset.empty() && !missing.empty() && !is_rejected("model.preset") &&
          !dimensions_from_hf) {
        error(ProblemKind::kMissing, "model",
              fmt::format("without a preset, n_layer, n_head, n_embd, vocab_size and "
                          "seq_len are required (missing: {})",
                          join(missing)));
      }
      if (m.n_head && *m.n_head > 0 && m.n_embd && *m.n_embd % *m.n_head != 0) {
        fail("model.n_embd",
             fmt::format("{} is not a multiple of n_head {}", *m.n_embd, *m.n_head));
      }
      return;
    }
    read_int("hidden_size", &m.hidden_size);
    read_int("intermediate_size", &m.intermediate_size);
    read_int("num_hidden_layers", &m.num_hidden_layers);
    read_int("num_attention_heads", &m.num_attention_heads);
    read_int("num_key_value_heads", &m.num_key_value_heads);
    read_int("head_dim", &m.head_dim);
    read_int("max_position_embeddings", &m.max_position_embeddings);
    read_int("sliding_window", &m.sliding_window);
    read_int("max_window_layers", &m.max_window_layers);
    read_number("rms_norm_eps", &m.rms_norm_eps);
    read_number("rope_theta", &m.rope_theta);
    read_bool("tie_word_embeddings", &m.tie_word_embeddings);
    read_bool("attention_bias", &m.attention_bias);
    if (has("model.rope_scaling.rope_type")) {
      m.rope_scaling.rope_type = get_string("model.rope_scaling.rope_type", "default");
    }
    read_number("rope_scaling.factor", &m.rope_scaling.factor);
    read_number("rope_scaling.low_freq_factor", &m.rope_scaling.low_freq_factor);
    read_number("rope_scaling.high_freq_factor", &m.rope_scaling.high_freq_factor);
    read_int("rope_scaling.original_max_position_embeddings",
             &m.rope_scaling.original_max_position_embeddings);
    read_number("rope_scaling.attention_factor", &m.rope_scaling.attention_factor);
    read_number("rope_scaling.beta_fast", &m.rope_scaling.beta_fast);
    read_number("rope_scaling.beta_slow", &m.rope_scaling.beta_slow);
    read_number("rope_scaling.mscale", &m.rope_scaling.mscale);
    read_number("rope_scaling.mscale_all_dim", &m.rope_scaling.mscale_all_dim);
    read_bool("rope_scaling.truncate", &m.rope_scaling.truncate);
    if (!moe) return;
    read_int("num_experts", &m.num_experts);
    read_int("num_experts_per_tok", &m.num_experts_per_tok);
    read_int("moe_intermediate_size", &m.moe_intermediate_size);
    read_int("shared_expert_intermediate_size", &m.shared_expert_intermediate_size);
    read_int("decoder_sparse_step", &m.decoder_sparse_step);
    read_bool("norm_topk_prob", &m.norm_topk_prob);
    read_number("router_aux_loss_coef", &m.router_aux_loss_coef);
    read_number("router_z_loss_coef", &m.router_z_loss_coef);
    read_number("capacity_factor", &m.capacity_factor);
    if (const json* layers = value("model.mlp_only_layers")) {
      std::vector<int> list;
      for (const json& l : *layers) list.push_back(static_cast<int>(l.get<double>()));
      m.mlp_only_layers = list;
    }
  }

  void read_run_blocks() {
    Config& c = config_;
    c.seed = static_cast<std::uint64_t>(get_int("seed", 1234));
    c.output_dir = get_string("output_dir", "output");
    if (c.output_dir.empty()) error(ProblemKind::kBadValue, "output_dir", "must not be empty");
    c.log_level = get_string("log_level", "info");

    if (!has("model") && !is_rejected("model")) {
      error_plain(ProblemKind::kMissing,
                  "model: required block is missing (e.g. \"model\": {\"preset\": \"gpt2-tiny\"})",
                  "model");
    }
    ModelConfig& m = c.model;
    m.init_from = get_string("model.init_from", "");
    // A Hugging Face model directory gives the architecture and its dimensions (config.json);
    // the architecture's registry entry checks the keys given here against it.
    const std::string hf_type = hf_model_type(m.init_from);
    m.type = get_string("model.type", hf_type.empty() ? "gpt2" : hf_type);
    m.preset = get_string("model.preset", "");
    read_model_keys(m, /*dimensions_from_hf=*/!hf_type.empty());
    m.activation_checkpointing = get_bool("model.activation_checkpointing", false);
    m.cpu_checkpointing = get_bool("activation_checkpointing.cpu_checkpointing", false);
    if (m.cpu_checkpointing && !m.activation_checkpointing) {
      warn("activation_checkpointing.cpu_checkpointing",
           "no effect without model.activation_checkpointing (there are no checkpoints to keep "
           "in host memory)");
    }
    m.frozen = get_string_list("model.frozen");
    m.trainable = get_string_list("model.trainable");
    if (has("model.frozen") && has("model.trainable")) {
      error(ProblemKind::kConflict, "model.trainable",
            "given with model.frozen: name the parameters to train (model.trainable) or those "
            "to freeze (model.frozen), not both");
    } else if (has("model.trainable") && m.trainable.empty()) {
      error(ProblemKind::kBadValue, "model.trainable",
            "[] trains nothing: name the parameters to train, or remove the key to train all");
    }
    m.head_tile_rows = static_cast<int>(get_int("model.tiling.head_rows", 0));
    m.mlp_tile_rows = static_cast<int>(get_int("model.tiling.mlp_rows", 0));
    if (has("model.tiling.mlp_rows") && m.type == "gpt2") {
      warn("model.tiling.mlp_rows",
           "no effect on GPT-2 (its MLP is not tiled: the Llama family's and the mixtures of "
           "experts' are); model.tiling.head_rows tiles its head");
    }
    m.expert_rows_reserve = get_number("model.expert_rows_reserve", kDefaultExpertRowsReserve);
    if (has("model.expert_rows_reserve") && c.engine.expert_parallel_size <= 1) {
      warn("model.expert_rows_reserve",
           "no effect without expert parallelism (expert_parallel.autoep_size > 1): every "
           "expert is local and its rows are the tokens' own");
    }

    if (!has("data") && !is_rejected("data")) {
      error_plain(ProblemKind::kMissing,
                  "data: required block is missing (e.g. \"data\": {\"train\": "
                  "\"data/kjv_train_*.bin\"})",
                  "data");
    }
    DataConfig& d = c.data;
    d.train = get_string("data.train", "");
    if (d.train.empty() && has("data") && !is_rejected("data.train")) {
      error(ProblemKind::kMissing, "data.train", "required: a token file path or glob");
    }
    d.val = get_string("data.val", "");
    d.shuffle = get_bool("data.shuffle", true);
    d.seed = static_cast<std::uint64_t>(get_int("data.seed", static_cast<std::int64_t>(c.seed)));
    d.document_mask = get_bool("data.document_mask", false);
    d.document_separator = get_int("data.document_separator", -1);

    if (!has("train") && !is_rejected("train")) {
      error_plain(ProblemKind::kMissing,
                  "train: required block is missing (e.g. \"train\": {\"steps\": 100})", "train");
    }
    TrainConfig& t = c.train;
    if (has("train") && !has("train.steps") && !is_rejected("train.steps")) {
      error(ProblemKind::kMissing, "train.steps", "required: the number of optimizer steps");
    }
    t.steps = get_int("train.steps", 0);
    t.eval_interval = get_int("train.eval_interval", 0);
    t.eval_batches = get_small_int("train.eval_batches", t.eval_batches);
    t.log_interval = get_int("train.log_interval", t.log_interval);
    t.sample_tokens = get_small_int("train.sample_tokens", 0);
    if (t.eval_interval > 0 && d.val.empty() && has("data") && !is_rejected("data.val")) {
      fail("train.eval_interval",
           fmt::format("evaluation every {} steps needs data.val", t.eval_interval));
    }
  }

  // The block at `path` without its rejected keys: those are reported already, and the
  // optimizers library would report them again.
  json without_rejected(const json& node, const std::string& path) const {
    if (!node.is_object()) return node;
    json out = json::object();
    for (const auto& item : node.items()) {
      const std::string child = join_path(path, item.key());
      if (rejected_.count(child) == 0) out[item.key()] = without_rejected(item.value(), child);
    }
    return out;
  }

  // The optimizers library's problems, in its words ("optimizer.params.eps must be > 0 ...").
  void report(const std::vector<ConfigProblem>& problems, const std::string& block) {
    for (const ConfigProblem& p : problems) {
      if (p.kind == ProblemKind::kWarning) {
        // "optimizer.params.adam_w_mode: ...": its path, then its words (Config::warnings).
        const std::string message = strip_location(p.message);
        const std::size_t colon = message.find(": ");
        if (colon != std::string::npos) {
          warn(message.substr(0, colon), message.substr(colon + 2));
        } else {
          warn(block, message);
        }
        continue;
      }
      error_plain(p.kind, strip_location(p.message), block);
    }
  }

  void read_optimizer_and_scheduler() {
    std::vector<ConfigProblem> problems;
    if (has("optimizer") && !is_rejected("optimizer.type")) {
      config_.optimizer =
          parse_optimizer_config(without_rejected(doc_["optimizer"], "optimizer"), problems);
      report(problems, "optimizer");
    }
    if (!has("scheduler") || is_rejected("scheduler.type")) return;
    json scheduler = without_rejected(doc_["scheduler"], "scheduler");
    const std::string total = "scheduler.params.total_num_steps";
    if (const json* v = find(total); v != nullptr && is_auto(*v)) {
      // "auto" is train.steps; without a usable train.steps (reported already) the schedule
      // cannot be checked.
      if (config_.train.steps <= 0) return;
      scheduler["params"]["total_num_steps"] = config_.train.steps;
    }
    problems.clear();
    config_.scheduler = parse_scheduler_config(scheduler, problems);
    report(problems, "scheduler");
    const SchedulerConfig& s = config_.scheduler;
    const bool scheduler_ok =
        std::all_of(problems.begin(), problems.end(),
                    [](const ConfigProblem& p) { return p.kind == ProblemKind::kWarning; });
    if (scheduler_ok && s.type != LrScheduleType::kConstant &&
        s.type != LrScheduleType::kWarmupLR && s.total_num_steps != config_.train.steps &&
        config_.train.steps > 0) {
      warn(total,
           fmt::format("{} differs from train.steps {}", s.total_num_steps, config_.train.steps));
    }
  }

  void read_checkpoint() {
    CheckpointConfig& k = config_.checkpoint;
    k.save_dir = get_string("checkpoint.save_dir", config_.output_dir + "/checkpoints");
    if (k.save_dir.empty()) fail("checkpoint.save_dir", "must not be empty");
    k.save_interval = get_int("checkpoint.save_interval", 0);
    k.save_interval_minutes = get_number("checkpoint.save_interval_minutes", 0.0);
    k.preempt_grace_s = get_number("checkpoint.preempt_grace_s", 0.0);
    k.stop_on_save_error = get_string("checkpoint.on_save_error", "stop") != "continue";
    k.keep_last = get_small_int("checkpoint.keep_last", 0);
    k.async = get_bool("checkpoint.async", false);
    k.direct_io = get_bool("checkpoint.direct_io", true);
    k.load = get_string("checkpoint.load", "auto");
    if (k.load.empty()) k.load = "none";  // configs written when "" meant a fresh start
    k.overwrite = get_bool("checkpoint.overwrite", false);
    if (k.overwrite && !k.loads_nothing()) {
      warn("checkpoint.overwrite",
           fmt::format("no effect: checkpoint.load is \"{}\" (overwrite applies to a fresh "
                       "start, \"load\": \"none\")",
                       k.load));
    }
    const std::string tag = lower(get_string("checkpoint.tag_validation", "warn"));
    k.tag_validation = tag == "ignore" ? TagValidation::kIgnore
                       : tag == "fail" ? TagValidation::kFail
                                       : TagValidation::kWarn;
    if (k.keep_last > 0 && !k.saves()) {
      warn("checkpoint.keep_last",
           "no effect: save_interval and save_interval_minutes are 0, so nothing is saved");
    }
  }

  // DeepSpeed's monitor blocks; wandb and comet stay accepted-with-warning keys (no network).
  void read_monitors() {
    for (auto [name, monitor] : {std::pair{"tensorboard", &config_.tensorboard},
                                 std::pair{"csv_monitor", &config_.csv_monitor}}) {
      const std::string path = name;
      monitor->enabled = get_bool(path + ".enabled", false);
      monitor->output_path = get_string(path + ".output_path", "");
      if (monitor->output_path.empty()) monitor->output_path = config_.output_dir;
      monitor->job_name = get_string(path + ".job_name", monitor->job_name);
    }
  }

  void read_device_comm_trace() {
    DeviceConfig& dev = config_.device;
    const std::string type = get_string("device.type", "auto");
    dev.type = type == "cpu"    ? DeviceChoice::kCpu
               : type == "cuda" ? DeviceChoice::kCuda
                                : DeviceChoice::kAuto;
    dev.memory_limit_gb = get_number("device.memory_limit_gb", 0.0);
    dev.stream_delay_us = get_small_int("device.stream_delay_us", 0);
    const bool cuda = dev.type == DeviceChoice::kCuda;
    if (cuda && dev.stream_delay_us > 0) {
      fail("device.stream_delay_us",
           "stream delays exist on the CPU backend only (device.type "
           "is cuda)");
    }

    CommOptions& comm = config_.comm;
    if (has("comm_timeout_s") && has("comm.timeout_s")) {
      fail("comm_timeout_s", "give comm_timeout_s or comm.timeout_s, not both");
    }
    comm.timeout_s =
        get_number(has("comm_timeout_s") ? "comm_timeout_s" : "comm.timeout_s", comm.timeout_s);
    comm.reduce_scatter_algo = get_string("comm.reduce_scatter", "alltoall") == "native"
                                   ? ReduceScatterAlgo::kNative
                                   : ReduceScatterAlgo::kAlltoall;
    comm.max_chunk_bytes = get_int("comm.max_chunk_mb", 32) << 20;
    comm.ranks_per_node = get_small_int("comm.ranks_per_node", 0);
    comm.host_staged = get_bool("comm.host_staged_collectives", false);
    comm.check_collective_sequence = get_bool("comm.check_collective_sequence", false);
    const int hpz = config_.engine.hpz_partition_size;
    if (hpz > 1 && comm.ranks_per_node > 0 && comm.ranks_per_node % hpz != 0) {
      fail("zero_optimization.zero_hpz_partition_size",
           fmt::format("{} does not divide comm.ranks_per_node {}: hpZ groups of {} consecutive "
                       "ranks would span nodes and the backward gathers would cross them; make "
                       "it the ranks per node or a divisor of it",
                       hpz, comm.ranks_per_node, hpz));
    }
    const int sp = config_.engine.sequence_parallel_size;
    if (sp > 1 && comm.ranks_per_node > 0 && comm.ranks_per_node % sp != 0) {
      fail("sequence_parallel_size",
           fmt::format("{} does not divide comm.ranks_per_node {}: a sequence-parallel group of "
                       "{} consecutive ranks would span nodes, and it exchanges activations every "
                       "layer; make it the ranks per node or a divisor of it",
                       sp, comm.ranks_per_node, sp));
    }
    report_expert_placement();
    comm.simulated_bandwidth_bytes_per_s = get_number("comm.simulated_bandwidth_gb_per_s", 0) * 1e9;
    comm.simulated_latency_s = get_number("comm.simulated_latency_us", 0) * 1e-6;
    if (cuda && (comm.simulated_bandwidth_bytes_per_s > 0 || comm.simulated_latency_s > 0)) {
      fail(has("comm.simulated_bandwidth_gb_per_s") ? "comm.simulated_bandwidth_gb_per_s"
                                                    : "comm.simulated_latency_us",
           "the link model exists on the CPU backend only (device.type is cuda)");
    }

    TraceConfig& tr = config_.trace;
    tr.path = get_string("trace.path", "");
    if (const json* steps = value("trace.steps")) {
      as_integer((*steps)[0], &tr.first_step);
      as_integer((*steps)[1], &tr.last_step);
      if (tr.first_step > tr.last_step) {
        fail("trace.steps", fmt::format("{}: the first step is after the last", shown(*steps)));
      }
      if (tr.path.empty()) warn("trace.steps", "no effect without trace.path");
    }
    if (tr.enabled() && tr.first_step > config_.train.steps) {
      warn("trace.steps",
           fmt::format("step {} is after the last step {}", tr.first_step, config_.train.steps));
    }
  }

  int world_size_;
  std::string source_;
  std::set<std::string> command_line_paths_;  // set by apply_overrides
  json doc_;
  Config config_;
  std::vector<Problem> errors_;
  std::set<std::string> rejected_;  // keys whose values are unusable (see the class comment)
};

}  // namespace

const char* offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

std::string ModelConfig::spec() const {
  std::vector<std::string> overrides;
  const std::pair<const char*, const std::optional<int>*> ints[] = {
      {"n_layer", &n_layer},
      {"n_head", &n_head},
      {"n_embd", &n_embd},
      {"vocab_size", &vocab_size},
      {"seq_len", &seq_len},
      {"hidden_size", &hidden_size},
      {"intermediate_size", &intermediate_size},
      {"num_hidden_layers", &num_hidden_layers},
      {"num_attention_heads", &num_attention_heads},
      {"num_key_value_heads", &num_key_value_heads},
      {"head_dim", &head_dim},
      {"max_position_embeddings", &max_position_embeddings},
      {"sliding_window", &sliding_window},
      {"max_window_layers", &max_window_layers},
      {"rope_scaling.original_max_position_embeddings",
       &rope_scaling.original_max_position_embeddings},
      {"num_experts", &num_experts},
      {"num_experts_per_tok", &num_experts_per_tok},
      {"moe_intermediate_size", &moe_intermediate_size},
      {"shared_expert_intermediate_size", &shared_expert_intermediate_size},
      {"decoder_sparse_step", &decoder_sparse_step}};
  for (const auto& [name, field] : ints) {
    if (field->has_value()) overrides.push_back(fmt::format("{}={}", name, **field));
  }
  const std::pair<const char*, const std::optional<double>*> numbers[] = {
      {"rms_norm_eps", &rms_norm_eps},
      {"rope_theta", &rope_theta},
      {"rope_scaling.factor", &rope_scaling.factor},
      {"rope_scaling.low_freq_factor", &rope_scaling.low_freq_factor},
      {"rope_scaling.high_freq_factor", &rope_scaling.high_freq_factor},
      {"rope_scaling.attention_factor", &rope_scaling.attention_factor},
      {"rope_scaling.beta_fast", &rope_scaling.beta_fast},
      {"rope_scaling.beta_slow", &rope_scaling.beta_slow},
      {"rope_scaling.mscale", &rope_scaling.mscale},
      {"rope_scaling.mscale_all_dim", &rope_scaling.mscale_all_dim},
      {"router_aux_loss_coef", &router_aux_loss_coef},
      {"router_z_loss_coef", &router_z_loss_coef},
      {"capacity_factor", &capacity_factor}};
  for (const auto& [name, field] : numbers) {
    if (field->has_value()) overrides.push_back(fmt::format("{}={}", name, **field));
  }
  const std::pair<const char*, const std::optional<bool>*> bools[] = {
      {"tie_word_embeddings", &tie_word_embeddings},
      {"attention_bias", &attention_bias},
      {"rope_scaling.truncate", &rope_scaling.truncate},
      {"norm_topk_prob", &norm_topk_prob}};
  for (const auto& [name, field] : bools) {
    if (field->has_value()) overrides.push_back(fmt::format("{}={}", name, **field));
  }
  if (mlp_only_layers) {
    // '+' separates the layers: ',' separates the spec's keys.
    std::vector<std::string> layers;
    for (int l : *mlp_only_layers) layers.push_back(std::to_string(l));
    overrides.push_back(fmt::format("mlp_only_layers={}", join(layers, "+")));
  }
  if (rope_scaling.rope_type) {
    overrides.push_back(fmt::format("rope_scaling.rope_type={}", *rope_scaling.rope_type));
  }
  if (preset.empty()) return join(overrides, ",");
  return overrides.empty() ? preset : preset + ":" + join(overrides, ",");
}

DeviceOptions DeviceConfig::options(int gpu_count, int local_rank, std::uint64_t seed) const {
  DeviceOptions o;
  const bool gpu_available = gpu_count > 0;
  if (type == DeviceChoice::kCuda && !gpu_available) {
    ZRT_THROW(InvalidArgument, "device.type is cuda, but no usable GPU was found");
  }
  const bool cuda = type == DeviceChoice::kCuda || (type == DeviceChoice::kAuto && gpu_available);
  o.type = cuda ? DeviceType::kCuda : DeviceType::kCpu;
  // More local ranks than GPUs: ranks share them round-robin (and their collectives go through
  // the host: comm.host_staged_collectives).
  o.index = cuda ? local_rank % gpu_count : 0;
  o.memory_limit_bytes = static_cast<std::int64_t>(std::llround(memory_limit_gb * 1073741824.0));
  o.stream_delay_max_us = cuda ? 0 : stream_delay_us;
  o.stream_delay_seed = seed;
  return o;
}

json resolved_document(const Config& c) {
  json out;
  out["train_batch_size"] = c.batch.train_batch_size;
  out["train_micro_batch_size_per_gpu"] = c.batch.micro_batch_size;
  out["gradient_accumulation_steps"] = c.batch.gradient_accumulation_steps;

  const EngineOptions& e = c.engine;
  out["bf16"]["enabled"] = c.bf16();
  json& fp16 = out["fp16"];
  fp16["enabled"] = c.fp16();
  if (c.fp16()) {  // the scaler's settings matter only with fp16 compute
    fp16["loss_scale"] = e.loss_scale.loss_scale;
    fp16["initial_scale_power"] = e.loss_scale.initial_scale_power;
    fp16["loss_scale_window"] = e.loss_scale.loss_scale_window;
    fp16["hysteresis"] = e.loss_scale.hysteresis;
    fp16["consecutive_hysteresis"] = e.loss_scale.consecutive_hysteresis;
    fp16["min_loss_scale"] = e.loss_scale.min_loss_scale;
  }
  out["communication_data_type"] = dtype_name(e.communication_dtype.value_or(e.compute_dtype));
  out["data_types"]["grad_accum_dtype"] = dtype_name(e.grad_accum_dtype);
  out["gradient_clipping"] = e.gradient_clipping;

  json& zero = out["zero_optimization"];
  zero["stage"] = e.stage;
  zero["reduce_bucket_size"] = e.reduce_bucket_size;
  zero["overlap_comm"] = e.overlap_comm;
  if (e.mics_shard_size > 0) zero["mics_shard_size"] = e.mics_shard_size;
  if (e.hpz_partition_size > 1) zero["zero_hpz_partition_size"] = e.hpz_partition_size;
  if (e.sequence_parallel_size > 1) out["sequence_parallel_size"] = e.sequence_parallel_size;
  if (e.expert_parallel_size > 1) {
    out["expert_parallel"] = {{"enabled", true}, {"autoep_size", e.expert_parallel_size}};
  }
  if (e.data_before_expert_parallel) out["use_data_before_expert_parallelism"] = true;
  if (e.quantized_weights) zero["zero_quantized_weights"] = true;
  if (e.quantized_gradients) zero["zero_quantized_gradients"] = true;
  if (e.stage == 3) {  // below stage 3 these keys draw a warning
    zero["stage3_prefetch_bucket_size"] = e.stage3_prefetch_bucket_size;
    zero["stage3_param_persistence_threshold"] = e.stage3_param_persistence_threshold;
    zero["stage3_max_live_parameters"] = e.stage3_max_live_parameters;
    zero["stage3_max_reuse_distance"] = e.stage3_max_reuse_distance;
  }
  const std::pair<const char*, const OffloadConfig*> offloads[] = {
      {"offload_optimizer", &c.offload_optimizer}, {"offload_param", &c.offload_param}};
  for (const auto& [name, offload] : offloads) {
    zero[name]["device"] = offload_device_name(offload->device);
    zero[name]["pin_memory"] = offload->pin_memory;
  }
  if (c.offload_optimizer.ratio < 1.0)
    zero["offload_optimizer"]["ratio"] = c.offload_optimizer.ratio;
  if (c.offload_optimizer.split_step != "auto")
    zero["offload_optimizer"]["split_step"] = c.offload_optimizer.split_step;

  json& optimizer = out["optimizer"];
  const AdamOptions& adam = c.optimizer.adam;
  const LionOptions& lion = c.optimizer.lion;
  optimizer["type"] = c.optimizer.type;
  if (c.optimizer.is_lion()) {
    optimizer["params"] = {
        {"lr", lion.lr}, {"betas", {lion.beta1, lion.beta2}}, {"weight_decay", lion.weight_decay}};
  } else {
    optimizer["params"] = {{"lr", adam.lr},
                           {"betas", {adam.beta1, adam.beta2}},
                           {"eps", adam.eps},
                           {"weight_decay", adam.weight_decay},
                           {"bias_correction", adam.bias_correction},
                           {"adam_w_mode", adam.adam_w_mode}};
  }
  optimizer["no_weight_decay"] = c.optimizer.no_weight_decay;
  const SchedulerConfig& s = c.scheduler;
  if (s.type != LrScheduleType::kConstant) {
    json& params = out["scheduler"]["params"];
    out["scheduler"]["type"] = lr_schedule_name(s.type);
    params["warmup_num_steps"] = s.warmup_num_steps;
    params["warmup_type"] = s.warmup_type == WarmupType::kLog ? "log" : "linear";
    if (s.type == LrScheduleType::kWarmupCosineLR) {
      params["warmup_min_ratio"] = s.warmup_min_ratio;
      params["cos_min_ratio"] = s.cos_min_ratio;
    } else {
      params["warmup_min_lr"] = s.warmup_min_lr;
      params["warmup_max_lr"] = s.warmup_max_lr;
    }
    if (s.type != LrScheduleType::kWarmupLR) params["total_num_steps"] = s.total_num_steps;
  }

  json& model = out["model"];
  model["type"] = c.model.type;
  if (!c.model.preset.empty()) model["preset"] = c.model.preset;
  const ModelConfig& m = c.model;
  const std::pair<const char*, const std::optional<int>*> dims[] = {
      {"n_layer", &m.n_layer},
      {"n_head", &m.n_head},
      {"n_embd", &m.n_embd},
      {"vocab_size", &m.vocab_size},
      {"seq_len", &m.seq_len},
      {"hidden_size", &m.hidden_size},
      {"intermediate_size", &m.intermediate_size},
      {"num_hidden_layers", &m.num_hidden_layers},
      {"num_attention_heads", &m.num_attention_heads},
      {"num_key_value_heads", &m.num_key_value_heads},
      {"head_dim", &m.head_dim},
      {"max_position_embeddings", &m.max_position_embeddings},
      {"sliding_window", &m.sliding_window},
      {"max_window_layers", &m.max_window_layers},
      {"num_experts", &m.num_experts},
      {"num_experts_per_tok", &m.num_experts_per_tok},
      {"moe_intermediate_size", &m.moe_intermediate_size},
      {"shared_expert_intermediate_size", &m.shared_expert_intermediate_size},
      {"decoder_sparse_step", &m.decoder_sparse_step}};
  for (const auto& [name, field] : dims) {
    if (field->has_value()) model[name] = **field;
  }
  if (m.norm_topk_prob) model["norm_topk_prob"] = *m.norm_topk_prob;
  if (m.mlp_only_layers) model["mlp_only_layers"] = *m.mlp_only_layers;
  if (m.router_aux_loss_coef) model["router_aux_loss_coef"] = *m.router_aux_loss_coef;
  if (m.router_z_loss_coef) model["router_z_loss_coef"] = *m.router_z_loss_coef;
  if (m.capacity_factor) model["capacity_factor"] = *m.capacity_factor;
  if (m.rms_norm_eps) model["rms_norm_eps"] = *m.rms_norm_eps;
  if (m.rope_theta) model["rope_theta"] = *m.rope_theta;
  if (m.tie_word_embeddings) model["tie_word_embeddings"] = *m.tie_word_embeddings;
  if (m.attention_bias) model["attention_bias"] = *m.attention_bias;
  const ModelConfig::RopeScaling& r = m.rope_scaling;
  if (r.rope_type) model["rope_scaling"]["rope_type"] = *r.rope_type;
  if (r.factor) model["rope_scaling"]["factor"] = *r.factor;
  if (r.low_freq_factor) model["rope_scaling"]["low_freq_factor"] = *r.low_freq_factor;
  if (r.high_freq_factor) model["rope_scaling"]["high_freq_factor"] = *r.high_freq_factor;
  if (r.original_max_position_embeddings) {
    model["rope_scaling"]["original_max_position_embeddings"] = *r.original_max_position_embeddings;
  }
  if (r.attention_factor) model["rope_scaling"]["attention_factor"] = *r.attention_factor;
  if (r.beta_fast) model["rope_scaling"]["beta_fast"] = *r.beta_fast;
  if (r.beta_slow) model["rope_scaling"]["beta_slow"] = *r.beta_slow;
  if (r.mscale) model["rope_scaling"]["mscale"] = *r.mscale;
  if (r.mscale_all_dim) model["rope_scaling"]["mscale_all_dim"] = *r.mscale_all_dim;
  if (r.truncate) model["rope_scaling"]["truncate"] = *r.truncate;
  model["activation_checkpointing"] = c.model.activation_checkpointing;
  if (c.model.head_tile_rows != 0) model["tiling"]["head_rows"] = c.model.head_tile_rows;
  if (c.model.mlp_tile_rows != 0) model["tiling"]["mlp_rows"] = c.model.mlp_tile_rows;
  if (c.model.expert_rows_reserve != kDefaultExpertRowsReserve) {
    model["expert_rows_reserve"] = c.model.expert_rows_reserve;
  }
  if (c.model.cpu_checkpointing) out["activation_checkpointing"]["cpu_checkpointing"] = true;
  if (!c.model.init_from.empty()) model["init_from"] = c.model.init_from;
  if (!c.model.frozen.empty()) model["frozen"] = c.model.frozen;
  if (!c.model.trainable.empty()) model["trainable"] = c.model.trainable;

  out["data"]["train"] = c.data.train;
  if (!c.data.val.empty()) out["data"]["val"] = c.data.val;
  out["data"]["shuffle"] = c.data.shuffle;
  out["data"]["seed"] = c.data.seed;
  if (c.data.document_mask) out["data"]["document_mask"] = true;
  if (c.data.document_separator >= 0) out["data"]["document_separator"] = c.data.document_separator;
  out["train"] = {{"steps", c.train.steps},
                  {"eval_interval", c.train.eval_interval},
                  {"eval_batches", c.train.eval_batches},
                  {"log_interval", c.train.log_interval},
                  {"sample_tokens", c.train.sample_tokens}};

  json& checkpoint = out["checkpoint"];
  checkpoint["save_dir"] = c.checkpoint.save_dir;
  checkpoint["save_interval"] = c.checkpoint.save_interval;
  checkpoint["save_interval_minutes"] = c.checkpoint.save_interval_minutes;
  checkpoint["preempt_grace_s"] = c.checkpoint.preempt_grace_s;
  checkpoint["on_save_error"] = c.checkpoint.stop_on_save_error ? "stop" : "continue";
  checkpoint["keep_last"] = c.checkpoint.keep_last;
  checkpoint["async"] = c.checkpoint.async;
  checkpoint["direct_io"] = c.checkpoint.direct_io;
  checkpoint["load"] = c.checkpoint.load;
  checkpoint["overwrite"] = c.checkpoint.overwrite;
  const std::pair<const char*, const MonitorConfig*> monitors[] = {{"tensorboard", &c.tensorboard},
                                                                   {"csv_monitor", &c.csv_monitor}};
  for (const auto& [name, monitor] : monitors) {
    if (!monitor->enabled) continue;
    out[name] = {
        {"enabled", true}, {"output_path", monitor->output_path}, {"job_name", monitor->job_name}};
  }

  const char* device_type = c.device.type == DeviceChoice::kCpu    ? "cpu"
                            : c.device.type == DeviceChoice::kCuda ? "cuda"
                                                                   : "auto";
  out["device"] = {{"type", device_type},
                   {"memory_limit_gb", c.device.memory_limit_gb},
                   {"stream_delay_us", c.device.stream_delay_us}};
  out["comm"] = {{"timeout_s", c.comm.timeout_s},
                 {"reduce_scatter",
                  c.comm.reduce_scatter_algo == ReduceScatterAlgo::kNative ? "native" : "alltoall"},
                 {"max_chunk_mb", c.comm.max_chunk_bytes >> 20},
                 {"ranks_per_node", c.comm.ranks_per_node},
                 {"host_staged_collectives", c.comm.host_staged},
                 {"check_collective_sequence", c.comm.check_collective_sequence},
                 {"simulated_bandwidth_gb_per_s", c.comm.simulated_bandwidth_bytes_per_s / 1e9},
                 {"simulated_latency_us", c.comm.simulated_latency_s * 1e6}};
  if (c.trace.enabled()) {
    out["trace"] = {{"path", c.trace.path}, {"steps", {c.trace.first_step, c.trace.last_step}}};
  }
  out["seed"] = c.seed;
  out["output_dir"] = c.output_dir;
  out["log_level"] = c.log_level;
  return out;
}

Config parse_config(const json& document, int world_size, const std::string& source_name,
                    const std::vector<std::string>& command_line_paths) {
  return Parser(document, world_size, source_name, command_line_paths).run();
}

ConfigDraft draft_config(const json& document, int world_size, const std::string& source_name,
                         const std::vector<std::string>& command_line_paths) {
  return Parser(document, world_size, source_name, command_line_paths).read();
}

Config parse_config(const json& document, int world_size, const std::string& source_name) {
  return parse_config(document, world_size, source_name, {});
}

Config parse_config_text(const std::string& text, int world_size, const std::string& source_name) {
  return parse_config(config::parse_json_text(text, source_name), world_size, source_name);
}

Config load_config(const std::string& path, int world_size) {
  return parse_config(config::read_json_file(path), world_size, path);
}

Config load_config(const std::string& path, int world_size, const ConfigOverrides& overrides) {
  json document = config::read_json_file(path);
  const std::vector<std::string> paths = apply_overrides(document, overrides);
  return parse_config(document, world_size, path, paths);
}

namespace {

// The JSON value of an override's text (see apply_overrides).
json override_value(const std::string& path, const std::string& text) {
  // A string key keeps its text even when it reads as JSON: a checkpoint tag of 100 or an
  // output_dir of 2024 are names, not numbers.
  if (const config::KeyInfo* key = config::find_key(path)) {
    const bool string_key = key->kind == KeyKind::kString || key->kind == KeyKind::kEnum ||
                            key->kind == KeyKind::kEnumNoCase;
    if (string_key && text != "null" && (text.empty() || text.front() != '"')) return text;
  }
  try {
    return config::parse_json_text(text, "--" + path);
  } catch (const InvalidArgument&) {
    return text;  // not JSON: a string (a path, a name)
  }
}

}  // namespace

std::vector<std::string> apply_overrides(json& document, const ConfigOverrides& overrides) {
  std::vector<std::string> paths;
  if (!document.is_object()) return paths;  // the parser reports the document itself
  for (const auto& [path, text] : overrides) {
    const std::vector<std::string> parts = split(path, '.');
    if (path.empty() ||
        std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
      throw InvalidArgument(fmt::format(
          "--{}: not a config key path (expected --block.key VALUE, e.g. --train.steps 5)", path));
    }
    json* node = &document;
    std::string at;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      at += (i > 0 ? "." : "") + parts[i];
      // A block the file does not have is the command line's too: a misspelt one
      // ("--trian.steps") is reported as the command line's, not the file's.
      if (!node->contains(parts[i])) paths.push_back(at);
      json& child = (*node)[parts[i]];
      // The command line wins over what the file has on the way (null, or a value where a
      // block belongs, which the parser would reject anyway).
      if (!child.is_object()) child = json::object();
      node = &child;
    }
    (*node)[parts.back()] = override_value(path, text);
    paths.push_back(path);
  }
  return paths;
}

}  // namespace zrt
