#include "train/device_peaks.h"

#include <fstream>
#include <string>
#include <thread>

#include <spdlog/fmt/fmt.h>

namespace zrt::train {

namespace {

struct GpuPeak {
  const char* name_part;
  double fp32_tflops;
  double half_tflops;  // bf16/fp16 dense tensor core
};

// Dense figures from the vendors' data sheets (SXM parts where there are several).
constexpr GpuPeak kGpus[] = {
    {"H200", 67.0, 989.0}, {"H100", 67.0, 989.0}, {"A100", 19.5, 312.0},
    {"L40S", 91.6, 362.0}, {"A10", 31.2, 125.0},  {"V100", 15.7, 125.0},
};

double cpu_ghz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return std::stod(line.substr(colon + 1)) / 1000.0;
    }
  }
  return 2.0;
}

}  // namespace

DevicePeak device_peak(const Device& device, DType compute_dtype, int local_ranks) {
  DevicePeak peak;
  const std::string description = device.description();
  if (device.type() == DeviceType::kCuda) {
    for (const GpuPeak& gpu : kGpus) {
      if (description.find(gpu.name_part) != std::string::npos) {
        const double tflops = compute_dtype == DType::kFloat32 ? gpu.fp32_tflops : gpu.half_tflops;
        peak.flops_per_s = tflops * 1e12;
        peak.source = fmt::format("{} {} dense peak {} TFLOP/s", gpu.name_part,
                                  dtype_name(compute_dtype), tflops);
        return peak;
      }
    }
    peak.source = "unknown GPU: MFU not reported";
    return peak;
  }
  // CPU: fp32 FMAs on AVX-512 (2 units x 16 lanes x 2 FLOPs) or AVX2 (2 x 8 x 2); 16-bit
  // storage still computes in fp32 here.
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const double per_cycle = avx512 ? 64.0 : 32.0;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double ghz = cpu_ghz();
  peak.flops_per_s = cores * ghz * 1e9 * per_cycle / std::max(1, local_ranks);
  peak.source = fmt::format("{} cores x {:.2f} GHz x {} FLOP/cycle ({}) / {} local ranks", cores,
                            ghz, per_cycle, avx512 ? "avx512" : "avx2", local_ranks);
  return peak;
}

}  // namespace zrt::train
