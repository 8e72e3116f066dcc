// Shared pieces of zrt-bench: subcommand signature, argument parsing and table printing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace zrt::bench {

// A subcommand: returns the process exit code. argv[0] is the subcommand name.
using Command = int (*)(int argc, char** argv);

int collectives(int argc, char** argv);
int step(int argc, char** argv);
int optimizer(int argc, char** argv);
int model(int argc, char** argv);
int checkpoint(int argc, char** argv);
int offload(int argc, char** argv);
int attention(int argc, char** argv);
int startup(int argc, char** argv);

// Minimal "--key value" / "--flag" parser; unknown options throw InvalidArgument naming them.
class Args {
 public:
  Args(int argc, char** argv, std::vector<std::string> known);
  bool has(const std::string& key) const;
  std::string get(const std::string& key, const std::string& fallback) const;
  double get_double(const std::string& key, double fallback) const;
  std::int64_t get_bytes(const std::string& key, std::int64_t fallback) const;  // "4K", "256M"

 private:
  std::vector<std::pair<std::string, std::string>> values_;
};

double median(std::vector<double> values);
// The largest of `seconds` over every rank of MPI_COMM_WORLD (collective): the slowest rank's.
double slowest_rank(double seconds);
// The non-empty items of a `sep`-separated list ("a,,b" -> {"a", "b"}).
std::vector<std::string> split_list(const std::string& text, char sep = ',');

// Fixed-width text table: set the header once, add rows, print.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string human_bytes(std::int64_t bytes);  // "4K", "1M", "256M" (powers of two)

// A shell command's standard output, or "" if it exits non-zero.
std::string run_capture(const std::string& command);
// The first python that imports torch: `requested`, $ZRT_PYTHON, python3, /usr/bin/python3
// (Debian's python3-torch installs for the system interpreter); "" if none.
std::string find_python(const std::string& requested);
// A script installed next to zrt-bench (tools/CMakeLists.txt copies them), else `fallback`
// (its path in the source tree).
std::string find_script(const std::string& name, const std::string& fallback);

}  // namespace zrt::bench
