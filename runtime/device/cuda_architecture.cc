#include "runtime/device/cuda_architecture.h"

#include <cctype>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

namespace zrt {

namespace {

struct Entry {
  int version = 0;        // 10 x major + minor
  bool specific = false;  // "90a": that version only
  bool machine_code = true;
  bool ptx = true;
};

// One entry of the list, or nothing if it is not a number with an optional "a" and suffix.
std::optional<Entry> parse_entry(std::string text) {
  Entry e;
  for (const auto& [suffix, machine, ptx] :
       {std::tuple{"-real", true, false}, std::tuple{"-virtual", false, true}}) {
    const std::string s = suffix;
    if (text.size() > s.size() && text.compare(text.size() - s.size(), s.size(), s) == 0) {
      text.resize(text.size() - s.size());
      e.machine_code = machine;
      e.ptx = ptx;
    }
  }
  if (!text.empty() && text.back() == 'a') {
    e.specific = true;
    text.pop_back();
  }
  if (text.empty() || text.size() > 3) return std::nullopt;
  for (const char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  e.version = std::stoi(text);
  return e;
}

bool runs(const Entry& e, int device) {
  if (e.specific) return device == e.version;
  const bool machine = e.machine_code && device / 10 == e.version / 10 && device >= e.version;
  const bool ptx = e.ptx && device >= e.version;
  return machine || ptx;
}

}  // namespace

std::optional<std::string> cuda_architecture_problem(int major, int minor,
                                                     const std::string& architectures) {
  const int device = 10 * major + minor;
  if (device < kMinCudaComputeCapability) {
    return fmt::format(
        "compute capability {}.{}: zrt's CUDA kernels need {}.{} or newer (bf16 tensor cores: "
        "A100, A10, L4, L40, H100 and later); train on the CPU backend (device.type cpu) or a "
        "newer GPU",
        major, minor, kMinCudaComputeCapability / 10, kMinCudaComputeCapability % 10);
  }
  std::string list = architectures;
  for (char& c : list) {
    if (c == ';') c = ',';
  }
  std::stringstream items(list);
  std::string item;
  bool any = false;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const std::optional<Entry> e = parse_entry(item);
    if (!e) return std::nullopt;  // all, all-major, native: not ours to judge
    any = true;
    if (runs(*e, device)) return std::nullopt;
  }
  if (!any) return std::nullopt;
  return fmt::format(
      "compute capability {}.{}, and this zrt was built for CUDA architectures {} "
      "(CMAKE_CUDA_ARCHITECTURES, or CUDAARCHS when configured), none of which runs on it: "
      "rebuild with CUDAARCHS={}{} (tools/build), or add {} to the list",
      major, minor, list, major, minor, 10 * major + minor);
}

}  // namespace zrt
