// zrt-bench startup: the host work of a large model's start-up, the way it was done before and
// the way zrt does it now, side by side in one run (medians over --repeats, interleaved):
// - the weights' normal draws, ns a value: libm's counter_normal in a loop against
//   fill_counter_normal on each ISA path, on one thread; then fill_counter_normal on the team;
// - --bytes of host memory made resident: one thread's memset of fresh memory (the offloaded
//   state's zeroing did this) against map_resident_host_pages (the host's threads); on a GPU
//   also cudaHostAlloc (the driver faulting in and locking the pages) against the device's
//   pinned allocation (resident pages + cudaHostRegister), the offloaded optimizer state's memory;
// - fp32 -> bf16 of --bytes / 4 values: the conversion on one thread against
//   convert_on_host_threads.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/init_rng.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/common/dtype.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"
#include "runtime/device/host_memory.h"
#include "runtime/engine/engine_kernels.h"
#include "tools/bench/bench.h"

#if ZRT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zrt::bench {

namespace {

double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

// Each way's median time over `repeats` rounds, the ways interleaved within a round.
std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& ways,
                                        int repeats) {
  std::vector<std::vector<double>> times(ways.size());
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t w = 0; w < ways.size(); ++w) times[w].push_back(seconds_of(ways[w]));
  }
  std::vector<double> medians;
  for (auto& t : times) medians.push_back(median(t));
  return medians;
}

}  // namespace

int startup(int argc, char** argv) {
  Args args(argc, argv, {"values", "bytes", "repeats", "device"});
  if (args.has("help")) {
    std::printf(
        "zrt-bench startup [--values 20000000] [--bytes 2G] [--repeats 3] [--device cpu|cuda]\n");
    return 0;
  }
  const auto values = static_cast<std::int64_t>(args.get_double("values", 2e7));
  const std::int64_t bytes = args.get_bytes("bytes", std::int64_t{2} << 30);
  const int repeats = static_cast<int>(args.get_double("repeats", 3));
  const bool cuda = args.get("device", "cpu") == "cuda";
  // The GPU first: without one the run ends here, not after the draws.
  std::unique_ptr<Device> device;
  if (cuda) {
#if ZRT_HAVE_CUDA
    DeviceOptions options;
    options.type = DeviceType::kCuda;
    device = make_device(options);
#else
    ZRT_THROW(InvalidArgument, "--device cuda: this zrt-bench was built without CUDA");
#endif
  }
  const int team = omp_get_max_threads();
  std::printf("# zrt-bench startup: %d OpenMP threads, median of %d, interleaved\n", team, repeats);

  // ---- the normal draws ----
  std::vector<float> out(static_cast<std::size_t>(values));
  std::vector<std::function<void()>> draws;
  std::vector<std::string> names;
  names.push_back("libm counter_normal loop, 1 thread");
  draws.push_back([&] {
    for (std::int64_t i = 0; i < values; ++i) {
      out[static_cast<std::size_t>(i)] =
          static_cast<float>(0.02 * counter_normal(1, 2, static_cast<std::uint64_t>(i)));
    }
  });
  for (CpuIsa isa : supported_cpu_isas()) {
    names.push_back(std::string("fill_counter_normal ") + cpu_isa_name(isa) + ", 1 thread");
    draws.push_back([&, isa] {
      omp_set_num_threads(1);
      fill_counter_normal(1, 2, 0, values, 0.02, out.data(), isa);
      omp_set_num_threads(team);
    });
  }
  names.push_back("fill_counter_normal " + std::string(cpu_isa_name(active_cpu_isa())) + ", " +
                  std::to_string(team) + " threads");
  draws.push_back([&] { fill_counter_normal(1, 2, 0, values, 0.02, out.data()); });
  const std::vector<double> draw_times = interleaved_medians(draws, repeats);
  Table draw_table({"normal draws", "ns/value", "vs libm"});
  for (std::size_t w = 0; w < draws.size(); ++w) {
    draw_table.add({names[w], fixed(draw_times[w] * 1e9 / static_cast<double>(values), 2),
                    fixed(draw_times[0] / draw_times[w], 2)});
  }
  std::printf("%s\n", draw_table.str().c_str());

  // ---- host memory made resident ----
  const auto size = static_cast<std::size_t>(bytes);
  std::vector<std::function<void()>> residents = {
      [&] {
        void* p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
        ZRT_CHECK(p != nullptr, "out of host memory ({} bytes)", size);
        std::memset(p, 0, size);
        asm volatile("" : : "r"(p) : "memory");  // the memory escapes: the memset stays
        std::free(p);
      },
      [&] {
        std::string error;
        void* p = map_resident_host_pages(size, &error);
        ZRT_CHECK(p != nullptr, "{}", error);
        unmap_resident_host_pages(p, size);
      }};
  std::vector<std::string> resident_names = {"fresh memory memset on 1 thread",
                                             "map_resident_host_pages"};
#if ZRT_HAVE_CUDA
  if (cuda) {
    resident_names.push_back("cudaHostAlloc");
    residents.push_back([&] {
      void* p = nullptr;
      ZRT_CHECK(cudaHostAlloc(&p, size, cudaHostAllocDefault) == cudaSuccess,
                "cudaHostAlloc of {} bytes failed", size);
      ZRT_CHECK(cudaFreeHost(p) == cudaSuccess, "cudaFreeHost failed");
    });
    resident_names.push_back("device pinned allocation (resident pages + cudaHostRegister)");
    residents.push_back([&] {
      Buffer pinned =
          device->allocate(bytes, MemCategory::kOther, "startup bench", MemorySpace::kPinnedHost);
    });
  }
#endif
  const std::vector<double> resident_times = interleaved_medians(residents, repeats);
  Table resident_table(
      {"host memory made resident (" + human_bytes(bytes) + ")", "s", "GB/s", "vs memset"});
  for (std::size_t w = 0; w < residents.size(); ++w) {
    resident_table.add({resident_names[w], fixed(resident_times[w], 3),
                        fixed(static_cast<double>(bytes) / 1e9 / resident_times[w], 2),
                        fixed(resident_times[0] / resident_times[w], 2)});
  }
  std::printf("%s\n", resident_table.str().c_str());

  // ---- fp32 -> bf16 ----
  const std::int64_t n = bytes / 4;
  std::vector<float> master(static_cast<std::size_t>(n));
  fill_counter_normal(3, 4, 0, n, 0.02, master.data());
  std::vector<bf16> converted(static_cast<std::size_t>(n));
  const std::vector<double> convert_times = interleaved_medians(
      {[&] {
         engine_kernels::cpu::convert(master.data(), DType::kFloat32, converted.data(),
                                      DType::kBFloat16, n);
       },
       [&] {
         engine_kernels::cpu::convert_on_host_threads(master.data(), DType::kFloat32,
                                                      converted.data(), DType::kBFloat16, n);
       }},
      repeats);
  Table convert_table({"fp32 -> bf16 (" + human_bytes(bytes) + " of fp32)", "s", "vs 1 thread"});
  convert_table.add({"convert, 1 thread", fixed(convert_times[0], 3), "1.00"});
  convert_table.add({"convert_on_host_threads", fixed(convert_times[1], 3),
                     fixed(convert_times[0] / convert_times[1], 2)});
  std::printf("%s", convert_table.str().c_str());
  return 0;
}

}  // namespace zrt::bench
