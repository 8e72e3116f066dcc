// Strict JSON reading for config files: syntax errors and duplicate keys are reported with the
// file name, line and column ("run.json:12:5: duplicate key 'zero_optimization.stage' (first
// on line 9)"). nlohmann::json would otherwise keep the last of two equal keys without a word.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace zrt::config {

// Parses `text`; `source_name` (usually the file name) starts every error message. Throws
// InvalidArgument for a syntax error ("<source>:<line>:<column>: JSON syntax error ...") or a
// duplicate key at any depth ("<source>:<line>:<column>: duplicate key '<path>' ...").
nlohmann::json parse_json_text(const std::string& text, const std::string& source_name);

// Reads and parses the file at `path` (messages start with `path`). Throws InvalidArgument if
// the file cannot be read.
nlohmann::json read_json_file(const std::string& path);

// Line and column (both 1-based) of byte `offset` (0-based) of `text`.
struct TextPosition {
  int line = 1;
  int column = 1;
};
TextPosition position_of(const std::string& text, std::size_t offset);

}  // namespace zrt::config
