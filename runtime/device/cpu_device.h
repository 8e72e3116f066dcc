// The CPU backend's device: "device memory" is aligned host memory (so a CPU rank can stand in
// for a GPU of a given capacity), streams are worker threads, copies are memcpy on the stream.
// Large pinned host buffers are resident pages faulted in by the host's threads, the memory the
// CUDA backend page-locks (host_memory.h).
#pragma once

#include <mutex>
#include <vector>

#include "runtime/device/device.h"

namespace zrt {

class CpuStream;

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const DeviceOptions& options);
  ~CpuDevice() override;

  DeviceType type() const override { return DeviceType::kCpu; }
  std::string description() const override;
  Buffer allocate(std::int64_t bytes, MemCategory category, const std::string& label,
                  MemorySpace space, Stream* order) override;
  void release(void* ptr, std::int64_t bytes, MemorySpace space, MemCategory category,
               Stream* order) noexcept override;
  std::unique_ptr<Stream> create_stream(const std::string& name) override;
  using Device::create_event;
  std::unique_ptr<Event> create_event(EventWait wait) override;
  std::unique_ptr<HostSignal> create_host_signal() override;
  void copy(DevicePtr<std::byte> dst, DevicePtr<const std::byte> src, std::size_t bytes,
            Stream& stream) override;
  void copy_to_device(DevicePtr<std::byte> dst, const void* src, std::size_t bytes,
                      Stream& stream) override;
  void copy_to_host(void* dst, DevicePtr<const std::byte> src, std::size_t bytes,
                    Stream& stream) override;
  void fill_zero(DevicePtr<std::byte> dst, std::size_t bytes, Stream& stream) override;
  void synchronize() override;
  const void* host_address(DevicePtr<const std::byte> p) const override;

 private:
  void forget_stream(CpuStream* stream);
  // Whether a buffer is a resident mapping (large pinned host memory) or from aligned_alloc.
  static bool maps_resident_pages(MemorySpace space, std::int64_t bytes);
  static void free_host(void* ptr, MemorySpace space, std::int64_t bytes) noexcept;

  DeviceOptions options_;
  std::mutex streams_mutex_;
  std::vector<CpuStream*> streams_;  // live streams, for synchronize()
  std::uint64_t streams_created_ = 0;
};

}  // namespace zrt
