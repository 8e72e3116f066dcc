#include "runtime/common/name_pattern.h"

#include <algorithm>
#include <cctype>
#include <cstddef>

namespace zrt {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The class starting at pattern[p] == '[' against character c: sets `matched` and returns the
// index just past its ']', or std::string::npos when the class is not closed.
std::size_t match_class(const std::string& pattern, std::size_t p, char c, bool& matched) {
  std::size_t i = p + 1;
  const bool negated = i < pattern.size() && pattern[i] == '!';
  if (negated) ++i;
  bool found = false;
  // A ']' right after the opening (or after '!') is a member, as in fnmatch.
  for (bool first = true; i < pattern.size() && (first || pattern[i] != ']'); first = false) {
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      found = found || (pattern[i] <= c && c <= pattern[i + 2]);
      i += 3;
    } else {
      found = found || pattern[i] == c;
      ++i;
    }
  }
  if (i >= pattern.size()) return std::string::npos;
  matched = found != negated;
  return i + 1;
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& text) {
  // Iterative matcher with single-star backtracking: O(|pattern| * |text|) worst case.
  std::size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    std::size_t next = std::string::npos;  // past the pattern element matching text[t]
    if (p < pattern.size()) {
      if (pattern[p] == '[') {
        bool matched = false;
        const std::size_t end = match_class(pattern, p, text[t], matched);
        if (end == std::string::npos) {
          if (text[t] == '[') next = p + 1;  // unclosed: a literal '['
        } else if (matched) {
          next = end;
        }
      } else if (pattern[p] == '?' || (pattern[p] != '*' && pattern[p] == text[t])) {
        next = p + 1;
      }
    }
    if (next != std::string::npos) {
      p = next;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool name_matches_pattern(const std::string& pattern, const std::string& name) {
  const std::string glob = lower(pattern);
  const std::string text = lower(name);
  if (glob.find('.') != std::string::npos) return glob_match(glob, text);
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('.', begin);
    if (end == std::string::npos) end = text.size();
    if (glob_match(glob, text.substr(begin, end - begin))) return true;
    begin = end + 1;
  }
  return false;
}

}  // namespace zrt
