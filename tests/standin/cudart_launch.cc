// Kernel registration and launch: the calls nvcc's host stubs make (__cudaRegisterFatBinary,
// __cudaRegisterFunction, __cudaPushCallConfiguration / __cudaPopCallConfiguration,
// __cudaGetKernel, __cudaLaunchKernel) and cudaLaunchKernel, dispatched to CPU twins.
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include <spdlog/spdlog.h>

#include "tests/standin/kernel_twins.h"

namespace zrt::standin {

namespace {

// The dynamic shared memory a launch may ask for: 48 KiB, or what cudaFuncSetAttribute
// (cudaFuncAttributeMaxDynamicSharedMemorySize) allowed the kernel, at most the 227 KiB a block
// of an sm_90 GPU can opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr size_t kDefaultDynamicShared = 48u << 10;
constexpr size_t kOptInDynamicShared = 227u << 10;

struct KernelEntry {
  std::string mangled;
  std::string name;  // demangled
  void** module = nullptr;
  size_t max_dynamic_shared = kDefaultDynamicShared;  // under registry().mutex
};

struct LaunchRegistry {
  std::mutex mutex;
  std::map<const void*, KernelEntry*> by_host_fun;  // entries live forever (handles point at them)
  std::map<std::string, TwinAdapter> twins;
  bool twins_registered = false;
};

LaunchRegistry& registry() {
  static LaunchRegistry* r = new LaunchRegistry();
  return *r;
}

std::string demangle(const char* mangled) {
  int status = 0;
  char* out = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) return mangled;
  std::string name(out);
  std::free(out);
  return name;
}

void ensure_twins() {
  // Called with registry().mutex held.
  LaunchRegistry& r = registry();
  if (r.twins_registered) return;
  r.twins_registered = true;
  register_engine_twins();
  register_comm_twins();
  register_optimizer_twins();
  register_gpt_twins();
  register_flash_attention_twins();
  register_llama_twins();
  register_ulysses_twins();
  register_moe_twins();
}

struct CallConfig {
  dim3 grid, block;
  size_t shared = 0;
  cudaStream_t stream = nullptr;
};
thread_local std::vector<CallConfig> t_configs;

std::string dims(dim3 d) {
  return fmt::format("({}, {}, {})", d.x, d.y, d.z);
}

void launch(const KernelEntry& entry, dim3 grid, dim3 block, void** args, size_t shared,
            cudaStream_t stream, const char* call) {
  TwinAdapter adapter;
  size_t max_shared = 0;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    ensure_twins();
    auto it = registry().twins.find(entry.name);
    if (it == registry().twins.end()) {
      fail(cudaErrorInvalidDeviceFunction, call,
           fmt::format("kernel {} has no CPU twin registered in the stand-in", entry.name));
    }
    adapter = it->second;
    max_shared = entry.max_dynamic_shared;
  }
  const std::uint64_t threads = std::uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 || block.z > 64 ||
      grid.y > 65535 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration, call,
         fmt::format("kernel {}: invalid launch configuration grid {} block {}", entry.name,
                     dims(grid), dims(block)));
  }
  if (shared > max_shared) {
    fail(cudaErrorInvalidValue, call,
         fmt::format("kernel {}: {} B of dynamic shared memory exceeds its {} B (48 KiB unless "
                     "cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize allowed "
                     "more)",
                     entry.name, shared, max_shared));
  }
  KernelCall kc(entry.name, grid, block);
  try {
    adapter(kc, args);
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    fail(cudaErrorInvalidValue, call, fmt::format("kernel {}: {}", entry.name, e.what()));
  }
  if (!kc.body()) fail(cudaErrorUnknown, call, fmt::format("twin of {} set no body", entry.name));
  Runtime& rt = Runtime::get();
  std::lock_guard<std::mutex> lock(rt.mutex());
  auto* s = rt.stream(stream, call);
  for (const Access& a : kc.accesses()) {
    rt.check_range(fmt::format("{} of kernel {}", call, entry.name), a.arg, a.ptr, a.bytes,
                   {MemKind::kDevice, MemKind::kPinned});
  }
  rt.enqueue(*s, call, fmt::format("kernel {}", entry.name), kc.accesses(), std::move(kc.body()));
}

}  // namespace

void KernelCall::add(const void* p, std::int64_t bytes, bool write, const char* arg) {
  if (bytes < 0) {
    fail(cudaErrorInvalidValue, "cudaLaunchKernel",
         fmt::format("kernel {}: negative extent {} for {}", name_, bytes, arg));
  }
  if (bytes == 0) return;
  accesses_.push_back(Access{p, static_cast<std::size_t>(bytes), write, arg});
}

void KernelCall::require(bool ok, const std::string& message) {
  if (!ok)
    fail(cudaErrorInvalidConfiguration, "cudaLaunchKernel",
         fmt::format("kernel {}: {}", name_, message));
}

void KernelCall::require_block(unsigned threads) {
  require(block_.x == threads && block_.y == 1 && block_.z == 1,
          fmt::format("block {} but the kernel is written for ({}, 1, 1)", dims(block_), threads));
}

void KernelCall::require_threads(std::int64_t n, const char* what) {
  require(threads_x() >= n,
          fmt::format("launch grid too small for its data: grid {} x block {} = {} threads, but "
                      "{} = {} need one thread each",
                      dims(grid_), dims(block_), threads_x(), what, n));
}

void KernelCall::require_blocks(std::int64_t n, const char* what) {
  require(grid_.x >= n, fmt::format("launch grid too small for its data: grid {} has {} blocks "
                                    "in x, but {} = {} need one block each",
                                    dims(grid_), grid_.x, what, n));
}

void KernelCall::require_blocks_y(std::int64_t n, const char* what) {
  require(grid_.y >= n, fmt::format("launch grid too small for its data: grid {} has {} blocks "
                                    "in y, but {} = {} need one block each",
                                    dims(grid_), grid_.y, what, n));
}

void KernelCall::require_rows(std::int64_t n, int per_block, const char* what) {
  require(std::int64_t{grid_.x} * per_block >= n,
          fmt::format("launch grid too small for its data: grid {} covers {} x {} = {} {}, but "
                      "there are {}",
                      dims(grid_), grid_.x, per_block, std::int64_t{grid_.x} * per_block, what, n));
}

void register_twin(const std::string& name, TwinAdapter adapter) {
  // Called from ensure_twins (mutex held) or by tests through zrt_standin_register_twin.
  registry().twins[name] = std::move(adapter);
}

}  // namespace zrt::standin

using zrt::standin::api;
using zrt::standin::fail;
using zrt::standin::KernelEntry;
using zrt::standin::registry;

extern "C" {

void** __cudaRegisterFatBinary(void* /*fat_cubin*/) {
  return new void*(nullptr);
}

void __cudaRegisterFatBinaryEnd(void** /*handle*/) {}

void __cudaUnregisterFatBinary(void** /*handle*/) {
  // Kernel entries stay valid: launches during static destruction still find their twin.
}

void __cudaRegisterFunction(void** module, const char* host_fun, char* /*device_fun*/,
                            const char* device_name, int /*thread_limit*/, uint3* /*tid*/,
                            uint3* /*bid*/, dim3* /*bdim*/, dim3* /*gdim*/, int* /*wsize*/) {
  auto* entry = new KernelEntry{device_name, zrt::standin::demangle(device_name), module};
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().by_host_fun[host_fun] = entry;
}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                     struct CUstream_st* stream) {
  zrt::standin::t_configs.push_back({grid, block, shared, stream});
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  auto& configs = zrt::standin::t_configs;
  if (configs.empty()) return cudaErrorInvalidConfiguration;
  const auto c = configs.back();
  configs.pop_back();
  *grid = c.grid;
  *block = c.block;
  *shared = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_fun) {
  return api("__cudaGetKernel", [&] {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto it = registry().by_host_fun.find(host_fun);
    if (it == registry().by_host_fun.end()) {
      fail(cudaErrorInvalidDeviceFunction, "__cudaGetKernel", "function was never registered");
    }
    *kernel = reinterpret_cast<cudaKernel_t>(it->second);
  });
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared, cudaStream_t stream) {
  return api("cudaLaunchKernel", [&] {
    if (kernel == nullptr)
      fail(cudaErrorInvalidDeviceFunction, "cudaLaunchKernel", "no kernel handle");
    zrt::standin::launch(*reinterpret_cast<KernelEntry*>(kernel), grid, block, args, shared, stream,
                         "cudaLaunchKernel");
  });
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                    size_t shared, cudaStream_t stream) {
  return __cudaLaunchKernel(kernel, grid, block, args, shared, stream);
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                             cudaStream_t stream) {
  return api("cudaLaunchKernel", [&] {
    KernelEntry* entry = nullptr;
    {
      std::lock_guard<std::mutex> lock(registry().mutex);
      auto it = registry().by_host_fun.find(func);
      if (it == registry().by_host_fun.end()) {
        fail(cudaErrorInvalidDeviceFunction, "cudaLaunchKernel", "function was never registered");
      }
      entry = it->second;
    }
    zrt::standin::launch(*entry, grid, block, args, shared, stream, "cudaLaunchKernel");
  });
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  return api("cudaFuncSetAttribute", [&] {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto it = registry().by_host_fun.find(func);
    if (it == registry().by_host_fun.end()) {
      fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute", "function was never registered");
    }
    switch (attr) {
      case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || static_cast<size_t>(value) > zrt::standin::kOptInDynamicShared) {
          fail(cudaErrorInvalidValue, "cudaFuncSetAttribute",
               fmt::format("kernel {}: {} B of dynamic shared memory (0 to {} B)", it->second->name,
                           value, zrt::standin::kOptInDynamicShared));
        }
        it->second->max_dynamic_shared = static_cast<size_t>(value);
        return;
      case cudaFuncAttributePreferredSharedMemoryCarveout:
        if (value < -1 || value > 100) {
          fail(cudaErrorInvalidValue, "cudaFuncSetAttribute",
               fmt::format("carveout {}: -1 or 0 to 100", value));
        }
        return;
      default:
        fail(cudaErrorInvalidValue, "cudaFuncSetAttribute",
             fmt::format("attribute {} is not one the stand-in knows", static_cast<int>(attr)));
    }
  });
}

// ---- stand-in extensions for tests -------------------------------------------------------------

// Number of registered kernels; writes each one's name and whether it has a twin via `visit`.
int zrt_standin_visit_kernels(void (*visit)(const char* name, int has_twin, void* ctx), void* ctx) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  zrt::standin::ensure_twins();
  int n = 0;
  for (const auto& [fun, entry] : registry().by_host_fun) {
    visit(entry->name.c_str(), registry().twins.count(entry->name) ? 1 : 0, ctx);
    ++n;
  }
  return n;
}

// The calling thread's host waits that drained a stream (see Runtime::note_host_wait): calls
// `visit` once per stream drained at least once; returns the number of such streams.
int zrt_standin_visit_host_drains(void (*visit)(cudaStream_t stream, long long drains, void* ctx),
                                  void* ctx) {
  const auto drains = zrt::standin::Runtime::get().host_drains();
  for (const auto& [stream, count] : drains) visit(stream, count, ctx);
  return static_cast<int>(drains.size());
}

}  // extern "C"

// C++ entry for test-only twins (planted-bug tests register a twin for their own kernel).
namespace zrt::standin {
__attribute__((visibility("default"))) void register_test_twin(const std::string& name,
                                                               TwinAdapter adapter) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  ensure_twins();
  register_twin(name, std::move(adapter));
}
}  // namespace zrt::standin
