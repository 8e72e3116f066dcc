#include "config/json_reader.h"

#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "runtime/common/error.h"

namespace zrt::config {

namespace {

using json = nlohmann::json;

// Finds the first duplicate key in `text`, which must already be valid JSON. Walks the
// structure token by token, keeping one frame per open object or array.
void check_duplicate_keys(const std::string& text, const std::string& source_name) {
  struct Frame {
    bool object = false;
    std::string path;
    std::map<std::string, int> keys;  // key -> line of its first occurrence
    bool expect_key = false;
    std::string current_key;  // object: the key whose value comes next
    int index = 0;            // array: the index of the next element
  };
  std::vector<Frame> stack;
  auto child_path = [&]() -> std::string {
    if (stack.empty()) return "";
    const Frame& top = stack.back();
    if (top.object) return top.path.empty() ? top.current_key : top.path + "." + top.current_key;
    return top.path + "[" + std::to_string(top.index) + "]";
  };

  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '{' || c == '[') {
      Frame frame;
      frame.object = c == '{';
      frame.path = child_path();
      frame.expect_key = frame.object;
      stack.push_back(std::move(frame));
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
    } else if (c == ',') {
      if (!stack.empty()) {
        if (stack.back().object) {
          stack.back().expect_key = true;
        } else {
          ++stack.back().index;
        }
      }
    } else if (c == '"') {
      const std::size_t begin = i;
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;  // skip the escaped character
      }
      if (stack.empty() || !stack.back().object || !stack.back().expect_key) continue;
      Frame& top = stack.back();
      // The literal is valid JSON; let nlohmann undo its escapes.
      const std::string key = json::parse(text.substr(begin, i - begin + 1)).get<std::string>();
      top.expect_key = false;
      top.current_key = key;
      const TextPosition at = position_of(text, begin);
      const auto [it, inserted] = top.keys.emplace(key, at.line);
      if (!inserted) {
        throw InvalidArgument(fmt::format("{}:{}:{}: duplicate key '{}' (first on line {})",
                                          source_name, at.line, at.column, child_path(),
                                          it->second));
      }
    }
  }
}

}  // namespace

TextPosition position_of(const std::string& text, std::size_t offset) {
  TextPosition p;
  const std::size_t end = std::min(offset, text.size());
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++p.line;
      line_start = i + 1;
    }
  }
  p.column = static_cast<int>(end - line_start) + 1;
  return p;
}

json parse_json_text(const std::string& text, const std::string& source_name) {
  // nlohmann's parser takes a NUL byte for the end of the input and would accept whatever came
  // before it ("9\0garbage" parses as 9); no JSON text contains one (found by fuzz_config).
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    const TextPosition at = position_of(text, nul);
    throw InvalidArgument(
        fmt::format("{}:{}:{}: JSON syntax error: a NUL byte (is this a binary file?)", source_name,
                    at.line, at.column));
  }
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is the 1-based index of the character the parser stopped at.
    const TextPosition at = position_of(text, e.byte > 0 ? e.byte - 1 : 0);
    // what(): "[json.exception.parse_error.101] parse error at line 3, column 8: syntax error
    // while parsing value - unexpected '}'; ...": keep the part after the position.
    std::string detail = e.what();
    const std::size_t column = detail.find(", column ");
    if (column != std::string::npos) {
      const std::size_t colon = detail.find(": ", column);
      if (colon != std::string::npos) detail = detail.substr(colon + 2);
    }
    throw InvalidArgument(
        fmt::format("{}:{}:{}: JSON {}", source_name, at.line, at.column, detail));
  } catch (const json::out_of_range& e) {
    // A number too large for a double ("1e999"; found by fuzz_config). nlohmann names the
    // literal but not its position: find it in the text.
    const std::string what = e.what();
    const std::size_t open = what.find("parsing '");
    const std::size_t close = open == std::string::npos ? open : what.find('\'', open + 9);
    const std::string literal =
        close == std::string::npos ? std::string() : what.substr(open + 9, close - open - 9);
    const std::size_t offset = literal.empty() ? std::string::npos : text.find(literal);
    const TextPosition at = position_of(text, offset == std::string::npos ? 0 : offset);
    throw InvalidArgument(fmt::format("{}:{}:{}: JSON number out of range: {}", source_name,
                                      at.line, at.column, literal.empty() ? what : literal));
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: JSON error: {}", source_name, e.what()));
  }
  check_duplicate_keys(text, source_name);
  return document;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("{}: cannot open the config file", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InvalidArgument(fmt::format("{}: cannot read the config file", path));
  return parse_json_text(text.str(), path);
}

}  // namespace zrt::config
