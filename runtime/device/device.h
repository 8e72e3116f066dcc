// Device: the memory and stream seam. The engine, optimizers and models talk only to this
// interface; cpu_device and cuda_device implement it.
//
// Thread-safety: allocate/release and the tracker are thread-safe; each stream is driven by
// one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/device/buffer.h"
#include "runtime/device/memory_tracker.h"
#include "runtime/device/stream.h"

namespace zrt {
class CpuStream;
}

namespace zrt {

enum class DeviceType { kCpu, kCuda };
const char* device_type_name(DeviceType t);  // "cpu", "cuda"

struct DeviceOptions {
  DeviceType type = DeviceType::kCpu;
  int index = 0;                        // CUDA: the GPU this process uses (usually local rank)
  std::int64_t memory_limit_bytes = 0;  // 0: unlimited (CPU) / the GPU's memory (CUDA)
  // CPU backend only: sleep a random 0..stream_delay_max_us before each stream work item, so a
  // missing event wait shows up as a wrong result. 0 disables. Seeded for reproducibility.
  int stream_delay_max_us = 0;
  std::uint64_t stream_delay_seed = 1;
  // Every allocation starts as 0xFF bytes (NaN in fp32, bf16 and fp16): device memory holds
  // whatever was there before, while fresh host pages read as zero, so a read of bytes nobody
  // wrote shows up as NaN every time instead of now and then. CPU: a memset; CUDA: a
  // cudaMemsetAsync on the allocation's stream (a memset for host memory). A debugging aid:
  // every test runs with it (tests/CMakeLists.txt, ZRT_POISON_ALLOCATIONS).
  bool poison_allocations = false;
};

// How a host thread waits in Event::synchronize. kSpin: it polls, the lowest latency (CUDA's
// default with fewer contexts than cores), for the engine's own short waits. kBlock: it sleeps
// until the event completes and gives its core up, for waits on which other host work depends
// while it waits: optimizer offload's CPU threads waiting for a gradient piece or a staging
// buffer, and the engine's wait for the units' sums while that CPU work runs. A spinning waiter
// there took a core from the threads it was waiting for (the CUDA driver's thread that runs the
// copy stream's host callbacks, the CPU optimizer's team), and the copy stream stalled for
// milliseconds (BENCHMARKS.md, "GPU session"). The CPU backend's waits always sleep.
enum class EventWait { kSpin, kBlock };

class Device : public BufferOwner {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceType type() const = 0;
  // "cpu (capacity 4.00 GiB)", "cuda:0 NVIDIA H100 80GB HBM3".
  virtual std::string description() const = 0;
  MemoryTracker& tracker() { return tracker_; }
  const MemoryTracker& tracker() const { return tracker_; }

  // Allocates `bytes` in `space`, tagged with `category`; `label` names the request in an
  // out-of-memory error. If `order` is given, allocation and release are ordered on it.
  // Device memory and pinned host memory are 256-byte aligned, contents undefined.
  virtual Buffer allocate(std::int64_t bytes, MemCategory category, const std::string& label,
                          MemorySpace space = MemorySpace::kDevice, Stream* order = nullptr) = 0;

  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_event(EventWait wait) = 0;
  std::unique_ptr<Event> create_event() { return create_event(EventWait::kSpin); }
  // A HostSignal whose counter starts at 0, that this device's streams can wait for.
  virtual std::unique_ptr<HostSignal> create_host_signal() = 0;
  // A host thread as a stream, whatever the device: host work on host memory in stream order
  // (CpuStream::enqueue; its work may block on events), e.g. the CPU optimizer of optimizer
  // offload. Events of this device may be recorded on it and waited for.
  std::unique_ptr<CpuStream> create_host_stream(const std::string& name);

  // Stream-ordered copies (cudaMemcpyAsync): device-to-device, host-to-device, device-to-host.
  // Host memory must stay valid until the copy completes.
  virtual void copy(DevicePtr<std::byte> dst, DevicePtr<const std::byte> src, std::size_t bytes,
                    Stream& stream) = 0;
  virtual void copy_to_device(DevicePtr<std::byte> dst, const void* src, std::size_t bytes,
                              Stream& stream) = 0;
  virtual void copy_to_host(void* dst, DevicePtr<const std::byte> src, std::size_t bytes,
                            Stream& stream) = 0;
  // Stream-ordered memset to zero.
  virtual void fill_zero(DevicePtr<std::byte> dst, std::size_t bytes, Stream& stream) = 0;
  // Blocks until all streams of this device are idle.
  virtual void synchronize() = 0;
  // The host address of device memory the host may read in place, or null where it cannot (a
  // GPU's memory). The CPU device's memory is host memory: a checkpoint writes the engine's
  // state from it with no copy.
  // (Defined out of line: an inline body instantiates DevicePtr<const std::byte> in every
  // translation unit, which nvcc rejects.)
  virtual const void* host_address(DevicePtr<const std::byte> p) const;

 protected:
  explicit Device(std::int64_t capacity_bytes) : tracker_(capacity_bytes) {}
  MemoryTracker tracker_;
};

// Creates the device the options ask for. Throws if the CUDA backend is not built or no GPU
// is present.
std::unique_ptr<Device> make_device(const DeviceOptions& options);
// Whether ZRT_POISON_ALLOCATIONS (set, not empty, not "0") has make_device turn on
// DeviceOptions::poison_allocations.
bool poison_allocations_from_env();

// Number of CUDA devices usable by this process; 0 when the backend is not built, no driver is
// installed, or any CUDA error occurs (CUDA 13 without a driver returns error 35).
int cuda_device_count();

}  // namespace zrt
