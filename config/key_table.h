// The table of every key a zrt config may hold: DeepSpeed's keys (with what zrt does with each)
// and zrt's own blocks. One table serves three readers: the validator (unknown keys, expected
// types and ranges, which DeepSpeed features are errors), the generator of docs/config-keys.md,
// and the test that keeps that file equal to the generated text.
//
// Thread-safety: the table is immutable; every function here may be called from any thread.
#pragma once

#include <string>
#include <vector>

namespace zrt::config {

// What zrt does with a key.
enum class KeyStatus {
  kImplemented,          // read and honoured
  kAcceptedWithWarning,  // harmless (logging, tuning, memory layout): accepted, warned about
  kUnsupportedError,     // would change training and is not implemented: an error
};

// The form a value must have.
enum class KeyKind {
  kObject,      // a block whose keys are in the table
  kOpaque,      // a block whose keys are not checked (a DeepSpeed feature zrt does not read)
  kBool,        // true or false, never 0/1 or "true"
  kInt,         // an integer; integral floats such as 5e8 are accepted
  kNumber,      // any finite number
  kString,      // any string
  kEnum,        // one of `choices` ("a|b|c"), case-sensitive
  kEnumNoCase,  // one of `choices`, case-insensitive (DeepSpeed upper-cases these)
  kNumberPair,  // [x, y]
  kIntPair,     // [a, b], integers
  kStringList,  // ["...", ...]
  kIntList,     // [a, b, ...], integers (may be empty)
};

// What the Hugging Face value "auto" means for a key.
enum class AutoRule {
  kNone,        // an error naming the key
  kBatch,       // solved by the batch rule from the other two batch keys
  kDefault,     // the key's default
  kTrainSteps,  // train.steps
};

struct KeyInfo {
  const char* path;  // "zero_optimization.stage"
  KeyStatus status;
  KeyKind kind;
  const char* choices;  // kEnum/kEnumNoCase: "cpu|cuda|auto"; otherwise ""
  double min;           // inclusive numeric range (kInt, kNumber, pairs); NaN: unbounded
  double max;
  // As documented ("5e8", "none", "required"). The engine's keys read theirs from
  // EngineOptions{} (key_table.cc), so the documentation cannot drift from the engine.
  std::string default_text;
  // For keys that are not implemented: the JSON text of the value that leaves the feature off
  // (DeepSpeed's default), accepted without a word. An opaque block is off when it is empty or
  // its "enabled" is false. "" where every value counts.
  const char* off_value;
  AutoRule auto_rule;
  const char* meaning;  // one line
  bool deepspeed;       // a DeepSpeed key (else a zrt extension)
};

// Every key, parents before children, in documentation order.
const std::vector<KeyInfo>& key_table();

// The entry for a dotted path, or nullptr.
const KeyInfo* find_key(const std::string& path);

// The keys directly under `parent` ("" for the top level), in table order.
std::vector<std::string> child_keys(const std::string& parent);

// A name another framework gives one of zrt's settings ("ep_size"), so that an unknown key
// written from habit is answered with zrt's key, not only with the closest spelling.
struct ForeignKey {
  const char* name;    // the key's last component as the user wrote it
  const char* path;    // zrt's key
  const char* origin;  // whose name it is, and what differs ("DeepSpeed's MoE layer argument")
};

// Every foreign name zrt recognises, in documentation order.
const std::vector<ForeignKey>& foreign_keys();

// The entry for a key's last component, or nullptr.
const ForeignKey* find_foreign_key(const std::string& name);

// "an integer in [0, 3]", "true or false", "one of \"cpu\", \"cuda\", \"auto\"" ...
std::string expected_form(const KeyInfo& key);

const char* status_name(KeyStatus status);  // "implemented", "warning", "error"

// The Markdown text of docs/config-keys.md, generated from the table.
std::string generate_key_table_markdown();

}  // namespace zrt::config
