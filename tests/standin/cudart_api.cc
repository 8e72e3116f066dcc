// The CUDA runtime API subset zrt calls (memory, copies, streams, events, devices, errors),
// implemented on the CPU over standin_core. Semantics follow the CUDA runtime reference; the
// stand-in is stricter where CUDA leaves behaviour undefined (see standin_core.h).
#include <cuda.h>  // CUresult and the stream memory operations' flags
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "tests/standin/standin_core.h"

using zrt::standin::Access;
using zrt::standin::api;
using zrt::standin::fail;
using zrt::standin::MemKind;
using zrt::standin::Runtime;

namespace {

Runtime& rt() {
  return Runtime::get();
}

void check_out(const void* p, const char* call, const char* arg) {
  if (p == nullptr) fail(cudaErrorInvalidValue, call, fmt::format("{} is null", arg));
}

const char* kind_name(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "host-to-host";
    case cudaMemcpyHostToDevice:
      return "host-to-device";
    case cudaMemcpyDeviceToHost:
      return "device-to-host";
    case cudaMemcpyDeviceToDevice:
      return "device-to-device";
    case cudaMemcpyDefault:
      return "default";
  }
  return "invalid";
}

// The shared part of cudaMemcpyAsync / cudaMemcpy. sync: return only once the copy is done.
void memcpy_async(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                  cudaStream_t stream, bool sync, const char* call) {
  std::shared_ptr<zrt::CpuCompletion> done;
  zrt::standin::StreamState* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(rt().mutex());
    s = rt().stream(stream, call);
    const auto device_only = {MemKind::kDevice};
    const auto host_any = {MemKind::kPinned, MemKind::kPageable};
    MemKind src_kind = MemKind::kPageable, dst_kind = MemKind::kPageable;
    switch (kind) {
      case cudaMemcpyHostToDevice:
        src_kind = rt().check_range(call, "src (host-to-device)", src, count, host_any);
        dst_kind = rt().check_range(call, "dst (host-to-device)", dst, count, device_only);
        break;
      case cudaMemcpyDeviceToHost:
        src_kind = rt().check_range(call, "src (device-to-host)", src, count, device_only);
        dst_kind = rt().check_range(call, "dst (device-to-host)", dst, count, host_any);
        break;
      case cudaMemcpyDeviceToDevice:
        src_kind = rt().check_range(call, "src (device-to-device)", src, count, device_only);
        dst_kind = rt().check_range(call, "dst (device-to-device)", dst, count, device_only);
        break;
      case cudaMemcpyHostToHost:
        src_kind = rt().check_range(call, "src (host-to-host)", src, count, host_any);
        dst_kind = rt().check_range(call, "dst (host-to-host)", dst, count, host_any);
        break;
      case cudaMemcpyDefault: {
        const auto all = {MemKind::kDevice, MemKind::kPinned, MemKind::kPageable};
        src_kind = rt().check_range(call, "src", src, count, all);
        dst_kind = rt().check_range(call, "dst", dst, count, all);
        break;
      }
      default:
        fail(cudaErrorInvalidMemcpyDirection, call,
             fmt::format("kind {} is not a cudaMemcpyKind", static_cast<int>(kind)));
    }
    if (count == 0) return;
    const auto d = reinterpret_cast<std::uintptr_t>(dst);
    const auto sp = reinterpret_cast<std::uintptr_t>(src);
    if (d < sp + count && sp < d + count) {
      fail(cudaErrorInvalidValue, call,
           fmt::format("src {} and dst {} of {} B overlap (the memory areas may not overlap)", src,
                       dst, count));
    }
    const std::string what = fmt::format("{} ({}, {} B)", call, kind_name(kind), count);
    std::vector<Access> accesses{{src, count, false, "src"}, {dst, count, true, "dst"}};
    if (src_kind == MemKind::kPageable && dst_kind != MemKind::kPageable) {
      // Pageable source: staged at once, so the caller may reuse it on return.
      auto staged = std::make_shared<std::vector<std::byte>>(
          static_cast<const std::byte*>(src), static_cast<const std::byte*>(src) + count);
      done = rt().enqueue(*s, call, what, accesses,
                          [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    } else {
      done = rt().enqueue(*s, call, what, accesses,
                          [dst, src, count] { std::memcpy(dst, src, count); });
    }
    // Copies to pageable memory (and host-to-host ones) return only once complete.
    if (dst_kind == MemKind::kPageable) sync = true;
    if (sync) rt().note_host_wait(s->knows);
  }
  if (sync && done) {
    if (auto error = done->wait()) rt().rethrow_stream_failure(error, call);
  }
}

// cuStreamWaitValue32 (CU_STREAM_WAIT_VALUE_GEQ only, what zrt uses), handed out by
// cudaGetDriverEntryPointByVersion: stream work that polls the pinned word, as the GPU's front end
// does. The poll is not a tracked access: the word is written by the host while streams wait on
// it by design.
CUresult standin_stream_wait_value32(CUstream stream, CUdeviceptr address, cuuint32_t value,
                                     unsigned int flags) {
  const cudaError_t code = api("cuStreamWaitValue32", [&] {
    if (flags != CU_STREAM_WAIT_VALUE_GEQ)
      fail(cudaErrorInvalidValue, "cuStreamWaitValue32",
           fmt::format("flags {:#x} (the stand-in implements CU_STREAM_WAIT_VALUE_GEQ)", flags));
    auto* word = reinterpret_cast<const std::uint32_t*>(static_cast<std::uintptr_t>(address));
    if (reinterpret_cast<std::uintptr_t>(word) % sizeof(std::uint32_t) != 0)
      fail(cudaErrorInvalidValue, "cuStreamWaitValue32", "addr is not 4-byte aligned");
    std::lock_guard<std::mutex> lock(rt().mutex());
    rt().check_range("cuStreamWaitValue32", "addr", word, sizeof(std::uint32_t),
                     {MemKind::kPinned});
    auto* s = rt().stream(reinterpret_cast<cudaStream_t>(stream), "cuStreamWaitValue32");
    rt().enqueue(*s, "cuStreamWaitValue32", "wait for a host value", {}, [word, value] {
      while (static_cast<std::int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) < 0)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
  });
  return code == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

extern "C" {

// ---- devices -----------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  return api(
      "cudaGetDeviceCount",
      [&] {
        check_out(count, "cudaGetDeviceCount", "count");
        *count = rt().device_count();
      },
      true);
}

cudaError_t cudaSetDevice(int device) {
  return api("cudaSetDevice", [&] { rt().set_current_device(device); });
}

cudaError_t cudaGetDevice(int* device) {
  return api("cudaGetDevice", [&] {
    check_out(device, "cudaGetDevice", "device");
    *device = rt().current_device();
  });
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return api("cudaGetDeviceProperties", [&] {
    check_out(prop, "cudaGetDeviceProperties", "prop");
    if (device < 0 || device >= rt().device_count()) {
      fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties",
           fmt::format("device {} out of range ({} devices)", device, rt().device_count()));
    }
    std::memset(prop, 0, sizeof *prop);
    std::snprintf(prop->name, sizeof prop->name, "zrt CUDA stand-in (CPU)");
    prop->totalGlobalMem = rt().device_memory();
    prop->major = rt().compute_capability() / 10;
    prop->minor = rt().compute_capability() % 10;
    prop->multiProcessorCount = 132;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->sharedMemPerBlock = 48 << 10;
    prop->memoryBusWidth = 5120;
    prop->pciDeviceID = device;
    prop->hostRegisterSupported = rt().host_register() ? 1 : 0;
    prop->canUseHostPointerForRegisteredMem = rt().host_register() ? 1 : 0;
  });
}

cudaError_t cudaDeviceSynchronize(void) {
  return api("cudaDeviceSynchronize", [&] {
    zrt::check_not_in_host_callback("cudaDeviceSynchronize");
    rt().synchronize_device(rt().current_device());
  });
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  return api("cudaMemGetInfo", [&] {
    check_out(free, "cudaMemGetInfo", "free");
    check_out(total, "cudaMemGetInfo", "total");
    std::lock_guard<std::mutex> lock(rt().mutex());
    *total = rt().device_memory();
    *free = *total - rt().device_bytes_in_use(rt().current_device());
  });
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  return api("cudaDeviceGetDefaultMemPool", [&] {
    check_out(pool, "cudaDeviceGetDefaultMemPool", "pool");
    if (device < 0 || device >= rt().device_count()) {
      fail(cudaErrorInvalidDevice, "cudaDeviceGetDefaultMemPool",
           fmt::format("device {} out of range", device));
    }
    *pool = reinterpret_cast<cudaMemPool_t>(static_cast<std::uintptr_t>(0x9000 + device));
  });
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  return api("cudaMemPoolSetAttribute", [&] {
    const auto handle = reinterpret_cast<std::uintptr_t>(pool);
    if (handle < 0x9000 || handle >= 0x9000u + static_cast<unsigned>(rt().device_count())) {
      fail(cudaErrorInvalidValue, "cudaMemPoolSetAttribute", "pool is not a default pool");
    }
    check_out(value, "cudaMemPoolSetAttribute", "value");
    if (attr != cudaMemPoolAttrReleaseThreshold) {
      fail(cudaErrorInvalidValue, "cudaMemPoolSetAttribute",
           fmt::format("attribute {} is not supported by the stand-in", static_cast<int>(attr)));
    }
  });
}

// ---- memory ------------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t size) {
  return api("cudaMalloc", [&] {
    check_out(ptr, "cudaMalloc", "devPtr");
    *ptr = rt().allocate(size, MemKind::kDevice, "cudaMalloc");
  });
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  return api("cudaMallocAsync", [&] {
    check_out(ptr, "cudaMallocAsync", "devPtr");
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      rt().stream(stream, "cudaMallocAsync");
    }
    void* p = rt().allocate(size, MemKind::kDevice, "cudaMallocAsync");
    std::lock_guard<std::mutex> lock(rt().mutex());
    // The memory becomes usable in stream order: on this stream at once, elsewhere only after
    // an event wait (a "write" of the whole allocation by this stream).
    auto* s = rt().stream(stream, "cudaMallocAsync");
    rt().enqueue(*s, "cudaMallocAsync", fmt::format("cudaMallocAsync of {} B", size),
                 {{p, std::max<size_t>(size, 1), true, "the new allocation"}}, [] {});
    *ptr = p;
  });
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  return api("cudaFreeAsync", [&] {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(rt().mutex());
    auto* s = rt().stream(stream, "cudaFreeAsync");
    rt().check_range("cudaFreeAsync", "devPtr", ptr, 1, {MemKind::kDevice});
    zrt::standin::Allocation* a = rt().find(ptr);
    if (reinterpret_cast<std::uintptr_t>(ptr) != a->base) {
      fail(cudaErrorInvalidValue, "cudaFreeAsync",
           fmt::format("{} is not the start of its allocation",
                       zrt::standin::describe_pointer(ptr)));
    }
    const std::uintptr_t base = a->base;
    rt().enqueue(*s, "cudaFreeAsync", "cudaFreeAsync",
                 {{ptr, std::max<size_t>(a->bytes, 1), true, "devPtr"}},
                 [base] { Runtime::get().release(base); });
    a->freed_by = fmt::format("cudaFreeAsync on {}", s->name);
  });
}

cudaError_t cudaFree(void* ptr) {
  return api("cudaFree", [&] {
    if (ptr == nullptr) return;
    zrt::check_not_in_host_callback("cudaFree");
    int device = 0;
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      rt().check_range("cudaFree", "devPtr", ptr, 1, {MemKind::kDevice});
      zrt::standin::Allocation* a = rt().find(ptr);
      if (reinterpret_cast<std::uintptr_t>(ptr) != a->base) {
        fail(cudaErrorInvalidValue, "cudaFree",
             fmt::format("{} is not the start of its allocation",
                         zrt::standin::describe_pointer(ptr)));
      }
      device = a->device;
    }
    rt().synchronize_device(device);  // cudaFree synchronizes implicitly
    std::uintptr_t base = 0;
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      zrt::standin::Allocation* a = rt().find(ptr);
      rt().host_access("cudaFree", {{ptr, std::max<size_t>(a->bytes, 1), true, "devPtr"}});
      a->freed_by = "cudaFree";
      base = a->base;
    }
    rt().release(base);
  });
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  return api("cudaHostAlloc", [&] {
    check_out(ptr, "cudaHostAlloc", "pHost");
    if (flags & ~0xfu)
      fail(cudaErrorInvalidValue, "cudaHostAlloc", fmt::format("flags {:#x}", flags));
    *ptr = rt().allocate(size, MemKind::kPinned, "cudaHostAlloc");
  });
}

// Pinned memory is host memory the stand-in's streams address directly: the device pointer is
// the host pointer.
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  return api("cudaHostGetDevicePointer", [&] {
    check_out(device, "cudaHostGetDevicePointer", "pDevice");
    if (flags != 0)
      fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer", fmt::format("flags {:#x}", flags));
    std::lock_guard<std::mutex> lock(rt().mutex());
    rt().check_range("cudaHostGetDevicePointer", "pHost", host, 1, {MemKind::kPinned});
    *device = host;
  });
}

// The driver entry points zrt looks up: cuStreamWaitValue32 only.
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function,
                                             unsigned int cuda_version, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  return api("cudaGetDriverEntryPointByVersion", [&] {
    check_out(symbol, "cudaGetDriverEntryPointByVersion", "symbol");
    check_out(function, "cudaGetDriverEntryPointByVersion", "funcPtr");
    (void)flags;
    *function = nullptr;
    if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
    if (std::string(symbol) == "cuStreamWaitValue32" && cuda_version >= 12000) {
      *function = reinterpret_cast<void*>(&standin_stream_wait_value32);
      if (status != nullptr) *status = cudaDriverEntryPointSuccess;
    }
  });
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

// The program's memory page-locked: pinned for the stand-in's checks until cudaHostUnregister.
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  return api("cudaHostRegister", [&] {
    if (ptr == nullptr || size == 0)
      fail(cudaErrorInvalidValue, "cudaHostRegister", fmt::format("ptr {} size {}", ptr, size));
    if (!rt().host_register())
      fail(cudaErrorNotSupported, "cudaHostRegister",
           "the devices report no host registration (ZRT_STANDIN_HOST_REGISTER=0)");
    if (flags & ~0xfu)
      fail(cudaErrorInvalidValue, "cudaHostRegister", fmt::format("flags {:#x}", flags));
    rt().register_host(ptr, size, "cudaHostRegister");
  });
}

// As cudaFreeHost, every operation on the memory must be known complete.
cudaError_t cudaHostUnregister(void* ptr) {
  return api("cudaHostUnregister", [&] {
    zrt::check_not_in_host_callback("cudaHostUnregister");
    std::uintptr_t base = 0;
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      zrt::standin::Allocation* a = rt().find(ptr);
      if (a == nullptr || !a->registered || reinterpret_cast<std::uintptr_t>(ptr) != a->base ||
          !a->freed_by.empty()) {
        fail(cudaErrorHostMemoryNotRegistered, "cudaHostUnregister",
             fmt::format("{} is not the start of memory registered with cudaHostRegister",
                         zrt::standin::describe_pointer(ptr)));
      }
      rt().host_access("cudaHostUnregister", {{ptr, std::max<size_t>(a->bytes, 1), true, "ptr"}});
      a->freed_by = "cudaHostUnregister";
      base = a->base;
    }
    rt().release(base);
  });
}

// Unlike the driver (which may synchronize), the stand-in requires every operation on the
// memory to be known complete: pending work on freed memory is the bug it reports.
cudaError_t cudaFreeHost(void* ptr) {
  return api("cudaFreeHost", [&] {
    if (ptr == nullptr) return;
    zrt::check_not_in_host_callback("cudaFreeHost");
    std::uintptr_t base = 0;
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      rt().check_range("cudaFreeHost", "ptr", ptr, 1, {MemKind::kPinned});
      zrt::standin::Allocation* a = rt().find(ptr);
      if (a->registered) {
        fail(cudaErrorInvalidValue, "cudaFreeHost",
             fmt::format("{} was registered with cudaHostRegister, not allocated by "
                         "cudaHostAlloc: cudaHostUnregister releases it",
                         zrt::standin::describe_pointer(ptr)));
      }
      if (reinterpret_cast<std::uintptr_t>(ptr) != a->base) {
        fail(cudaErrorInvalidValue, "cudaFreeHost",
             fmt::format("{} is not the start of its allocation",
                         zrt::standin::describe_pointer(ptr)));
      }
      rt().host_access("cudaFreeHost", {{ptr, std::max<size_t>(a->bytes, 1), true, "ptr"}});
      a->freed_by = "cudaFreeHost";
      base = a->base;
    }
    rt().release(base);
  });
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return api("cudaMemcpyAsync",
             [&] { memcpy_async(dst, src, count, kind, stream, false, "cudaMemcpyAsync"); });
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return api("cudaMemcpy", [&] {
    zrt::check_not_in_host_callback("cudaMemcpy");
    rt().synchronize_device(rt().current_device());
    memcpy_async(dst, src, count, kind, nullptr, true, "cudaMemcpy");
  });
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  return api("cudaMemsetAsync", [&] {
    std::lock_guard<std::mutex> lock(rt().mutex());
    auto* s = rt().stream(stream, "cudaMemsetAsync");
    rt().check_range("cudaMemsetAsync", "devPtr", dst, count, {MemKind::kDevice});
    if (count == 0) return;
    rt().enqueue(*s, "cudaMemsetAsync", fmt::format("cudaMemsetAsync ({} B)", count),
                 {{dst, count, true, "devPtr"}},
                 [dst, value, count] { std::memset(dst, value, count); });
  });
}

// ---- streams -----------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return api("cudaStreamCreateWithFlags", [&] {
    check_out(stream, "cudaStreamCreateWithFlags", "pStream");
    if (flags > cudaStreamNonBlocking) {
      fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags", fmt::format("flags {:#x}", flags));
    }
    zrt::check_not_in_host_callback("cudaStreamCreateWithFlags");
    *stream = rt().create_stream("cudaStreamCreateWithFlags");
  });
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return api(
      "cudaStreamDestroy",
      [&] {
        zrt::check_not_in_host_callback("cudaStreamDestroy");
        rt().destroy_stream(stream, "cudaStreamDestroy");
      },
      true);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return api("cudaStreamSynchronize", [&] {
    zrt::check_not_in_host_callback("cudaStreamSynchronize");
    zrt::standin::StreamState* s = nullptr;
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      s = rt().stream(stream, "cudaStreamSynchronize");
    }
    rt().synchronize_stream(*s);
  });
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return api("cudaStreamWaitEvent", [&] {
    zrt::check_not_in_host_callback("cudaStreamWaitEvent");
    if (flags != 0 && flags != cudaEventWaitDefault) {
      fail(cudaErrorInvalidValue, "cudaStreamWaitEvent", fmt::format("flags {:#x}", flags));
    }
    std::lock_guard<std::mutex> lock(rt().mutex());
    auto* s = rt().stream(stream, "cudaStreamWaitEvent");
    auto* e = rt().event(event, "cudaStreamWaitEvent");
    rt().wait(*s, *e);
  });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  return api("cudaLaunchHostFunc", [&] {
    if (fn == nullptr) fail(cudaErrorInvalidValue, "cudaLaunchHostFunc", "fn is null");
    std::lock_guard<std::mutex> lock(rt().mutex());
    auto* s = rt().stream(stream, "cudaLaunchHostFunc");
    rt().enqueue(
        *s, "cudaLaunchHostFunc", "host function", {}, [fn, user_data] { fn(user_data); },
        /*host_fn=*/true);
  });
}

// ---- events ------------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return api("cudaEventCreateWithFlags", [&] {
    check_out(event, "cudaEventCreateWithFlags", "event");
    if (flags & ~0xfu)
      fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags", fmt::format("flags {:#x}", flags));
    *event = rt().create_event();
    std::lock_guard<std::mutex> lock(rt().mutex());
    rt().event(*event, "cudaEventCreateWithFlags")->flags = flags;
  });
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return api(
      "cudaEventDestroy", [&] { rt().destroy_event(event, "cudaEventDestroy"); }, true);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return api("cudaEventRecord", [&] {
    zrt::check_not_in_host_callback("cudaEventRecord");
    std::lock_guard<std::mutex> lock(rt().mutex());
    auto* s = rt().stream(stream, "cudaEventRecord");
    auto* e = rt().event(event, "cudaEventRecord");
    if (!(e->flags & cudaEventDisableTiming)) {
      // The time the stream gets here, for cudaEventElapsedTime (timing events only).
      rt().enqueue(*s, "cudaEventRecord", "timestamp", {}, [reached = e->reached_ms] {
        const auto now = std::chrono::steady_clock::now().time_since_epoch();
        reached->store(std::chrono::duration<double, std::milli>(now).count());
      });
    }
    rt().record(*e, *s);
  });
}

// As CUDA: both events recorded and complete, neither created with cudaEventDisableTiming.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  bool ready = true;
  const cudaError_t code = api("cudaEventElapsedTime", [&] {
    check_out(ms, "cudaEventElapsedTime", "ms");
    std::lock_guard<std::mutex> lock(rt().mutex());
    auto* a = rt().event(start, "cudaEventElapsedTime");
    auto* b = rt().event(end, "cudaEventElapsedTime");
    for (auto* e : {a, b}) {
      if (e->flags & cudaEventDisableTiming)
        fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime",
             "an event was created with cudaEventDisableTiming");
      if (!e->recorded)
        fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime",
             "an event has never been recorded");
    }
    ready = a->impl.query() && b->impl.query();
    if (ready) *ms = static_cast<float>(b->reached_ms->load() - a->reached_ms->load());
  });
  if (code != cudaSuccess) return code;
  if (!ready) {
    zrt::standin::set_last_error(cudaErrorNotReady,
                                 "cudaEventElapsedTime: an event's work is pending");
    return cudaErrorNotReady;
  }
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  bool ready = false;
  const cudaError_t code = api("cudaEventQuery", [&] {
    zrt::standin::VectorClock clock;
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      auto* e = rt().event(event, "cudaEventQuery");
      ready = e->impl.query();
      clock = e->clock;
    }
    if (ready) rt().host_learns(clock);
  });
  if (code != cudaSuccess) return code;
  if (!ready) {
    zrt::standin::set_last_error(cudaErrorNotReady, "cudaEventQuery: the event's work is pending");
    return cudaErrorNotReady;
  }
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return api("cudaEventSynchronize", [&] {
    zrt::check_not_in_host_callback("cudaEventSynchronize");
    zrt::standin::VectorClock clock;
    zrt::standin::EventState* e = nullptr;
    {
      std::lock_guard<std::mutex> lock(rt().mutex());
      e = rt().event(event, "cudaEventSynchronize");
      clock = e->clock;
      if (e->recorded) rt().note_host_wait(clock);
    }
    try {
      e->impl.synchronize();
    } catch (...) {
      rt().rethrow_stream_failure(std::current_exception(), "cudaEventSynchronize");
    }
    rt().host_learns(clock);
  });
}

// ---- errors ------------------------------------------------------------------------------------

cudaError_t cudaGetLastError(void) {
  if (auto sticky = rt().sticky()) return static_cast<cudaError_t>(sticky->first);
  return static_cast<cudaError_t>(zrt::standin::take_last_error());
}

cudaError_t cudaPeekAtLastError(void) {
  if (auto sticky = rt().sticky()) return static_cast<cudaError_t>(sticky->first);
  return static_cast<cudaError_t>(zrt::standin::peek_last_error());
}

const char* cudaGetErrorName(cudaError_t code) {
  switch (code) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotPermitted:
      return "cudaErrorNotPermitted";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    default:
      return "cudaErrorUnknown";
  }
}

// The standard text, followed by the stand-in's account of this thread's last such error.
const char* cudaGetErrorString(cudaError_t code) {
  const char* base = "unknown error";
  switch (code) {
    case cudaSuccess:
      base = "no error";
      break;
    case cudaErrorInvalidValue:
      base = "invalid argument";
      break;
    case cudaErrorMemoryAllocation:
      base = "out of memory";
      break;
    case cudaErrorInvalidConfiguration:
      base = "invalid configuration argument";
      break;
    case cudaErrorInvalidMemcpyDirection:
      base = "invalid copy direction for memcpy";
      break;
    case cudaErrorInvalidDeviceFunction:
      base = "invalid device function";
      break;
    case cudaErrorInvalidDevice:
      base = "invalid device ordinal";
      break;
    case cudaErrorInvalidResourceHandle:
      base = "invalid resource handle";
      break;
    case cudaErrorNotReady:
      base = "device not ready";
      break;
    case cudaErrorIllegalAddress:
      base = "an illegal memory access was encountered";
      break;
    case cudaErrorLaunchFailure:
      base = "unspecified launch failure";
      break;
    case cudaErrorNotPermitted:
      base = "operation not permitted";
      break;
    default:
      break;
  }
  const char* detail = zrt::standin::detail_for(code);
  if (detail == nullptr || code == cudaSuccess) return base;
  thread_local std::string text;
  text = fmt::format("{} [CUDA stand-in: {}]", base, detail);
  return text.c_str();
}

}  // extern "C"
