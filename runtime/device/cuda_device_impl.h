// The CUDA backend's Device, Stream and Event classes. Private to the backend (cuda_device.cc,
// the NCCL process group, CUDA kernels' launchers); everything else uses device.h.
//
// Ordering rules this backend adds to device.h / stream.h (all as in CUDA):
// - Device memory allocated with an ordering stream comes from cudaMallocAsync on that stream:
//   it is usable on that stream at once, and on another stream only after that stream has waited
//   on an event recorded on the ordering stream after the allocate() call. Without an ordering
//   stream the allocation is made on a device-owned allocation stream and synchronized before
//   allocate() returns, so it is usable everywhere at once (as on the CPU backend).
// - Releasing device memory with an ordering stream is cudaFreeAsync on it: the owner must have
//   made that stream wait for every other stream still using the memory. Without an ordering
//   stream it is cudaFreeAsync on the allocation stream, i.e. immediate: as on the CPU backend,
//   no work may still use it.
// - Host memory (pinned or pageable) released with an ordering stream is freed once an event
//   recorded on that stream at release time has completed (freeing pinned memory is a CUDA call,
//   which a host callback may not make), checked on later allocate/release/synchronize calls.
// - Host callbacks run on a CUDA-owned thread. An exception thrown by one is logged and becomes
//   the stream's sticky error: later callbacks on that stream are skipped, and
//   Stream::synchronize() and Event::synchronize() on an event recorded after it rethrow it.
//   GPU work after the failed callback still runs (CUDA cannot skip it), and the error does not
//   propagate to streams that wait on the failed one. A callback must not own Buffers (their
//   release would call CUDA from the callback; it is refused and the memory leaks, logged).
#pragma once

#include <cuda.h>  // the driver API's types only: its functions come through the runtime
#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/device/cuda_device.h"

namespace zrt {

// Throws if called from inside a CUDA host callback (CUDA forbids CUDA calls there; the CPU
// backend enforces the same rule).
void check_not_in_cuda_host_callback(const char* api);

// Returns true iff `event` has completed (or was never recorded), false while it is pending;
// throws on any other result. Clears the cudaErrorNotReady it may leave as the thread's last
// error, so a later cudaGetLastError() (a kernel launch check) does not report it.
bool cuda_event_complete(cudaEvent_t event);

// The host-callback errors of one stream, shared with the events recorded on it. Thread-safe.
class CudaStreamErrors {
 public:
  // Sequence number of the next host callback enqueued on the stream.
  std::uint64_t next_callback() { return enqueued_.fetch_add(1); }
  // Number of callbacks enqueued so far (an event recorded now follows all of them).
  std::uint64_t enqueued() const { return enqueued_.load(); }
  // Records the error of callback `seq` (the first error is kept).
  void fail(std::uint64_t seq, std::exception_ptr error);
  // The error of a failed callback with sequence number < bound, or null.
  std::exception_ptr error_before(std::uint64_t bound) const;

 private:
  std::atomic<std::uint64_t> enqueued_{0};
  mutable std::mutex mutex_;
  std::uint64_t failed_seq_ = UINT64_MAX;
  std::exception_ptr error_;
};

// A cudaStream_t created with cudaStreamNonBlocking. Driven by one thread.
class CudaStream final : public Stream {
 public:
  // Creates the stream on `device` (made current). on_destroy, if set, is called with this
  // stream at the end of the destructor.
  CudaStream(std::string name, int device, std::function<void(CudaStream*)> on_destroy = {});
  // Waits for the enqueued work (logging errors), then destroys the stream.
  ~CudaStream() override;

  const std::string& name() const override { return name_; }
  void wait(const Event& event) override;
  void wait(const HostSignal& signal, std::uint32_t value) override;
  void synchronize() override;
  void host_callback(std::function<void()> fn) override;
  // Spans are pairs of timing events; their times are read when the recorder writes (after the
  // GPU is done). The first span for a recorder records a reference event and waits for it once,
  // to place GPU times on the recorder's host clock.
  void trace_begin(TraceRecorder& recorder, TraceTrack track, std::string label) override;
  void trace_end() override;

  cudaStream_t handle() const { return stream_; }
  int device() const { return device_; }
  const std::shared_ptr<CudaStreamErrors>& errors() const { return errors_; }
  // Rethrows the first host-callback error of this stream, if any.
  void rethrow_error() const;

 private:
  const std::string name_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<CudaStreamErrors> errors_ = std::make_shared<CudaStreamErrors>();
  std::function<void(CudaStream*)> on_destroy_;
  // Timeline trace state (trace_begin / trace_end).
  struct TimingEvent;  // an owned cudaEvent_t with timing
  struct OpenSpan {
    TraceRecorder* recorder = nullptr;  // null: no span open
    TraceTrack track;
    std::string label;
    std::shared_ptr<TimingEvent> begin;
  };
  OpenSpan span_;
  std::uint64_t reference_recorder_ = 0;  // id of the recorder the reference belongs to
  std::shared_ptr<TimingEvent> reference_;
  double reference_us_ = 0.0;  // the reference event's time on the recorder's clock
};

// A cudaEvent_t created with cudaEventDisableTiming.
class CudaEvent final : public Event {
 public:
  CudaEvent(int device, EventWait wait);
  ~CudaEvent() override;

  void record(Stream& stream) override;
  void synchronize() override;
  bool query() const override;

  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  // Its device: synchronize() may run on another thread (a checkpoint writer waiting for a
  // state copy), which must not create a context on device 0.
  int device_ = 0;
  // The recording stream's callback errors and how many of its callbacks precede the record.
  std::shared_ptr<CudaStreamErrors> recorded_errors_;
  std::uint64_t recorded_callbacks_ = 0;
};

// cuStreamWaitValue32 as the runtime hands it out (cudaGetDriverEntryPointByVersion): the
// binary needs no link against the driver library, and runs where the driver lacks it.
using CuStreamWaitValue32 = CUresult (*)(CUstream stream, CUdeviceptr address, cuuint32_t value,
                                         unsigned int flags);

// The CUDA backend's HostSignal: a word of mapped pinned memory. A stream waits for it with
// cuStreamWaitValue32 (the GPU polls the word; no host thread involved), or, where the driver
// does not offer stream memory operations, with a host callback that sleeps until the raise.
class CudaHostSignal final : public HostSignal {
 public:
  // wait_value: null selects the host-callback wait.
  CudaHostSignal(int device, CuStreamWaitValue32 wait_value);
  ~CudaHostSignal() override;
  void raise(std::uint32_t value) noexcept override;
  std::uint32_t value() const noexcept override;

  // Makes later work on `stream` wait until the counter reaches `value`.
  void enqueue_wait(CudaStream& stream, std::uint32_t value);

 private:
  struct State {
    std::uint32_t* word = nullptr;  // pinned, mapped: the counter the GPU polls
    CUdeviceptr device_word = 0;
    std::mutex mutex;  // the host-callback wait sleeps on `cv`; raise notifies under it
    std::condition_variable cv;
    std::uint32_t waited_max = 0;  // what the destructor raises to
    bool waited = false;
  };
  std::shared_ptr<State> state_;
  int device_;
  CuStreamWaitValue32 wait_value_;
};

class CudaDevice final : public Device {
 public:
  // options.index must be a valid device; use make_cuda_device, which checks.
  explicit CudaDevice(const DeviceOptions& options);
  ~CudaDevice() override;

  DeviceType type() const override { return DeviceType::kCuda; }
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

  // The CUDA device ordinal.
  int index() const { return index_; }
  // Makes this device current on the calling thread (cudaSetDevice).
  void activate() const;

 private:
  CudaDevice(const DeviceOptions& options, const cudaDeviceProp& props);
  // The allocation, or null with *out_of_memory saying why the allocator had no memory.
  void* allocate_raw(std::int64_t bytes, const std::string& label, MemorySpace space, Stream* order,
                     std::string* out_of_memory);
  // Frees host memory whose release was ordered on a stream; wait: block until all are done.
  void reap_host_frees(bool wait) noexcept;
  void forget_stream(CudaStream* stream);
  // Large pinned buffers are resident pages faulted in by the host's threads, then page-locked
  // with cudaHostRegister (host_memory.h): cudaHostAlloc faults them in on one thread. Only
  // where the GPU reaches registered memory at its host address, as kernels storing into pinned
  // memory expect (cudaDevAttrCanUseHostPointerForRegisteredMem).
  bool registers_pinned(std::int64_t bytes) const;
  void* allocate_pinned(std::int64_t bytes, std::string* out_of_memory);
  void free_pinned(void* ptr, std::int64_t bytes) noexcept;

  struct PendingHostFree {
    cudaEvent_t done;  // recorded on the ordering stream at release time
    void* ptr;
    MemorySpace space;
    std::int64_t bytes;
  };

  const int index_;
  const std::string name_;
  const std::int64_t total_memory_;
  const bool registers_host_memory_;          // cudaHostRegister, used at the host pointer
  const bool poison_allocations_;             // DeviceOptions::poison_allocations
  cudaStream_t alloc_stream_ = nullptr;       // orders allocations made without an ordering stream
  CuStreamWaitValue32 wait_value_ = nullptr;  // null: the driver offers no stream memory ops
  std::mutex pending_mutex_;
  std::vector<PendingHostFree> pending_;
  std::mutex streams_mutex_;
  std::vector<CudaStream*> streams_;  // live streams, for synchronize()
};

// The CUDA device behind `device`, or throws naming `what` if it is another backend's.
CudaDevice& as_cuda_device(Device& device, const char* what);
// The CUDA stream behind `stream`, or throws naming `what` if it is another backend's.
CudaStream& as_cuda_stream(Stream& stream, const char* what);

}  // namespace zrt
