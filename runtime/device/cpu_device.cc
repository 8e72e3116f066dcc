#include "runtime/device/cpu_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/device/cpu_stream.h"
#include "runtime/device/device_access.h"
#include "runtime/device/host_memory.h"

namespace zrt {

namespace {
constexpr std::size_t kAlignment = 256;  // as cudaMalloc guarantees

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}
}  // namespace

CpuDevice::CpuDevice(const DeviceOptions& options)
    : Device(options.memory_limit_bytes), options_(options) {}

CpuDevice::~CpuDevice() {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  if (!streams_.empty()) {
    spdlog::error("CpuDevice destroyed while {} of its streams are alive", streams_.size());
  }
}

std::string CpuDevice::description() const {
  if (tracker_.capacity() > 0) {
    return fmt::format("cpu (simulated capacity {})", format_bytes(tracker_.capacity()));
  }
  return "cpu";
}

Buffer CpuDevice::allocate(std::int64_t bytes, MemCategory category, const std::string& label,
                           MemorySpace space, Stream* order) {
  tracker_.on_allocate(space, category, bytes, label);  // throws OutOfMemory over capacity
  std::string failure = "the host allocation failed";
  void* ptr = nullptr;
  if (maps_resident_pages(space, bytes)) {
    // Pinned memory is resident, as on a GPU's host: the same pre-faulted pages the CUDA
    // backend page-locks (host_memory.h).
    ptr = map_resident_host_pages(static_cast<std::size_t>(bytes), &failure);
  } else {
    const std::size_t size =
        round_up(std::max<std::size_t>(static_cast<std::size_t>(bytes), 1), kAlignment);
    ptr = std::aligned_alloc(kAlignment, size);
  }
  if (ptr == nullptr) {
    tracker_.on_free(space, category, bytes);
    tracker_.throw_out_of_memory(space, category, bytes, label, failure);
  }
  if (options_.poison_allocations) std::memset(ptr, 0xFF, static_cast<std::size_t>(bytes));
  return Buffer(this, ptr, bytes, space, category, order);
}

bool CpuDevice::maps_resident_pages(MemorySpace space, std::int64_t bytes) {
  return space == MemorySpace::kPinnedHost &&
         uses_resident_host_pages(static_cast<std::size_t>(bytes));
}

void CpuDevice::free_host(void* ptr, MemorySpace space, std::int64_t bytes) noexcept {
  if (maps_resident_pages(space, bytes)) {
    unmap_resident_host_pages(ptr, static_cast<std::size_t>(bytes));
  } else {
    std::free(ptr);
  }
}

void CpuDevice::release(void* ptr, std::int64_t bytes, MemorySpace space, MemCategory category,
                        Stream* order) noexcept {
  tracker_.on_free(space, category, bytes);
  if (order != nullptr) {
    // Stream-ordered release, as cudaFreeAsync: work already enqueued on `order` may still use it.
    try {
      as_cpu_stream(*order, "Buffer release").enqueue_release([ptr, space, bytes] {
        free_host(ptr, space, bytes);
      });
      return;
    } catch (const std::exception& e) {
      spdlog::error("stream-ordered free failed ({}); synchronizing instead", e.what());
      try {
        order->synchronize();
      } catch (...) {
      }
    }
  }
  free_host(ptr, space, bytes);
}

std::unique_ptr<Stream> CpuDevice::create_stream(const std::string& name) {
  check_not_in_host_callback("Device::create_stream");
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto stream = std::make_unique<CpuStream>(name, options_.stream_delay_max_us,
                                            options_.stream_delay_seed + streams_created_++,
                                            [this](CpuStream* s) { forget_stream(s); });
  streams_.push_back(stream.get());
  return stream;
}

void CpuDevice::forget_stream(CpuStream* stream) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.erase(std::remove(streams_.begin(), streams_.end(), stream), streams_.end());
}

std::unique_ptr<Event> CpuDevice::create_event(EventWait /*wait*/) {
  return std::make_unique<CpuEvent>();  // its waits sleep on a condition variable either way
}

std::unique_ptr<HostSignal> CpuDevice::create_host_signal() {
  return std::make_unique<CpuHostSignal>();
}

void CpuDevice::copy(DevicePtr<std::byte> dst, DevicePtr<const std::byte> src, std::size_t bytes,
                     Stream& stream) {
  std::byte* d = device_access::raw(dst);
  const std::byte* s = device_access::raw(src);
  as_cpu_stream(stream, "Device::copy").enqueue([d, s, bytes] { std::memmove(d, s, bytes); });
}

void CpuDevice::copy_to_device(DevicePtr<std::byte> dst, const void* src, std::size_t bytes,
                               Stream& stream) {
  std::byte* d = device_access::raw(dst);
  as_cpu_stream(stream, "Device::copy_to_device").enqueue([d, src, bytes] {
    std::memcpy(d, src, bytes);
  });
}

void CpuDevice::copy_to_host(void* dst, DevicePtr<const std::byte> src, std::size_t bytes,
                             Stream& stream) {
  const std::byte* s = device_access::raw(src);
  as_cpu_stream(stream, "Device::copy_to_host").enqueue([dst, s, bytes] {
    std::memcpy(dst, s, bytes);
  });
}

void CpuDevice::fill_zero(DevicePtr<std::byte> dst, std::size_t bytes, Stream& stream) {
  std::byte* d = device_access::raw(dst);
  as_cpu_stream(stream, "Device::fill_zero").enqueue([d, bytes] { std::memset(d, 0, bytes); });
}

const void* CpuDevice::host_address(DevicePtr<const std::byte> p) const {
  return device_access::raw(p);
}

void CpuDevice::synchronize() {
  check_not_in_host_callback("Device::synchronize");
  std::vector<CpuStream*> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    streams = streams_;
  }
  std::vector<std::function<void()>> drains;
  for (CpuStream* s : streams) drains.push_back([s] { s->synchronize(); });
  drain_each(drains);  // every stream, also after one fails
}

}  // namespace zrt
