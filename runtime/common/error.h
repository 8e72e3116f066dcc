// Error types and checking macros. Library code reports failures by throwing zrt::Error (or a
// subclass) with the source location and enough context to act on; it never calls exit().
#pragma once

#include <stdexcept>
#include <string>

#include <spdlog/fmt/fmt.h>

namespace zrt {

// Base of every error zrt throws. what() carries "file:line: message".
class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& message);
  explicit Error(const std::string& message) : std::runtime_error(message), message_(message) {}
  // The message without its source location: for a list of a user's own mistakes (zrt-train
  // --check), where "train/frozen_parameters.cc:108:" tells them nothing.
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// A configuration or argument the user supplied is invalid.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A device (or simulated device) allocation would exceed its capacity.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A collective or wait did not finish within comm_timeout_s.
class Timeout : public Error {
 public:
  using Error::Error;
};

// A ZRT_CHECK that failed: zrt's own invariant broken, a bug, not the user's mistake.
class InternalError : public Error {
 public:
  using Error::Error;
};

// What a command-line tool prints for an error: the message alone for the user's mistakes and
// their machine's (a value, a file, a full disk), where "runtime/data/token_shard.cc:102:" tells
// them nothing; what() with its source location for an InternalError (a bug: the location is
// what a report needs) and for exceptions zrt did not throw.
std::string error_text(const std::exception& e);

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace zrt

// ZRT_CHECK(cond, "fmt {}", args...): throws zrt::InternalError naming the failed condition.
#define ZRT_CHECK(cond, ...)                                                    \
  do {                                                                          \
    if (!(cond)) {                                                              \
      ::zrt::detail::throw_error(                                               \
          __FILE__, __LINE__,                                                   \
          std::string("check failed: " #cond ": ") + fmt::format(__VA_ARGS__)); \
    }                                                                           \
  } while (0)

// ZRT_THROW(Type, "fmt {}", args...): throws Type with file:line context.
#define ZRT_THROW(Type, ...) throw Type(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
