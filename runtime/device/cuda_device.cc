#include "runtime/device/cuda_device.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"
#include "runtime/device/cuda_architecture.h"
#include "runtime/device/cuda_device_impl.h"
#include "runtime/device/device_access.h"
#include "runtime/device/host_memory.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

namespace {

constexpr std::size_t kAlignment = 256;  // what cudaMalloc guarantees; device.h promises it

thread_local bool t_in_cuda_host_callback = false;

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

// One heap-allocated host callback: owned by the trampoline once cudaLaunchHostFunc succeeded.
struct HostCallback {
  std::function<void()> fn;
  std::shared_ptr<CudaStreamErrors> errors;
  std::uint64_t seq;
  std::string stream_name;
};

void CUDART_CB run_host_callback(void* data) {
  std::unique_ptr<HostCallback> callback(static_cast<HostCallback*>(data));
  // Sticky errors: once a callback of this stream failed, later ones are skipped.
  if (callback->errors->error_before(callback->seq)) return;
  t_in_cuda_host_callback = true;
  try {
    callback->fn();
  } catch (const std::exception& e) {
    spdlog::error("host callback on stream '{}' failed: {}", callback->stream_name, e.what());
    callback->errors->fail(callback->seq, std::current_exception());
  } catch (...) {
    spdlog::error("host callback on stream '{}' failed with a non-standard exception",
                  callback->stream_name);
    callback->errors->fail(callback->seq, std::current_exception());
  }
  // Destroy the captures while the flag is still set: a capture that calls CUDA (a Buffer's
  // release) is then refused instead of calling CUDA from a callback.
  callback->fn = nullptr;
  t_in_cuda_host_callback = false;
}

bool is_cuda_oom(cudaError_t code) {
  return code == cudaErrorMemoryAllocation;
}

}  // namespace

void check_cuda(cudaError_t code, const char* call, const char* file, int line) {
  if (code == cudaSuccess) return;
  throw Error(file, line,
              fmt::format("{} failed: {} ({}, error {})", call, cudaGetErrorString(code),
                          cudaGetErrorName(code), static_cast<int>(code)));
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it: "no GPU" is not an error for the caller
    return 0;
  }
  return count;
}

void check_not_in_cuda_host_callback(const char* api) {
  ZRT_CHECK(!t_in_cuda_host_callback,
            "{} called from a host callback; host callbacks may not call the stream API (as in "
            "CUDA)",
            api);
}

bool cuda_event_complete(cudaEvent_t event) {
  const cudaError_t code = cudaEventQuery(event);
  if (code == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  ZRT_CUDA_CHECK(code);
  return true;
}

// ---- CudaStreamErrors ------------------------------------------------------------------------

void CudaStreamErrors::fail(std::uint64_t seq, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (seq < failed_seq_) {
    failed_seq_ = seq;
    error_ = std::move(error);
  }
}

std::exception_ptr CudaStreamErrors::error_before(std::uint64_t bound) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_seq_ < bound ? error_ : nullptr;
}

// ---- CudaHostSignal ----------------------------------------------------------------------------

CudaHostSignal::CudaHostSignal(int device, CuStreamWaitValue32 wait_value)
    : state_(std::make_shared<State>()), device_(device), wait_value_(wait_value) {
  ZRT_CUDA_CHECK(cudaSetDevice(device_));
  void* word = nullptr;
  // A cache line of its own: the GPU's polling reads touch nothing else.
  ZRT_CUDA_CHECK(cudaHostAlloc(&word, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  state_->word = static_cast<std::uint32_t*>(word);
  *state_->word = 0;
  void* device_word = nullptr;
  const cudaError_t code = cudaHostGetDevicePointer(&device_word, word, 0);
  if (code != cudaSuccess) {
    cudaFreeHost(word);
    ZRT_CUDA_CHECK(code);
  }
  state_->device_word = reinterpret_cast<CUdeviceptr>(device_word);
}

CudaHostSignal::~CudaHostSignal() {
  bool pending = false;
  bool waited = false;
  std::uint32_t to = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const std::uint32_t now = __atomic_load_n(state_->word, __ATOMIC_ACQUIRE);
    waited = state_->waited;
    pending = waited && !host_signal_reached(now, state_->waited_max);
    to = state_->waited_max;
  }
  if (pending) {
    spdlog::error("host signal destroyed while a stream waits for {}; raising it", to);
    raise(to);
  }
  // A stream may not have reached its wait yet, and the wait reads the word: let every stream
  // pass it before the word goes (the owner has synchronized its streams by now, so this is
  // quick).
  if (waited) {
    const cudaError_t code =
        cudaSetDevice(device_) == cudaSuccess ? cudaDeviceSynchronize() : cudaGetLastError();
    if (code != cudaSuccess) {
      spdlog::error("host signal: waiting for the streams before freeing it failed: {}",
                    cudaGetErrorString(code));
    }
  }
  if (const cudaError_t code = cudaFreeHost(state_->word); code != cudaSuccess) {
    spdlog::error("cudaFreeHost of a host signal failed: {}", cudaGetErrorString(code));
  }
}

void CudaHostSignal::raise(std::uint32_t value) noexcept {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    // Every host write before the raise, streamed (non-temporal) stores included, is globally
    // visible before the GPU can see the new counter.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    __atomic_store_n(state_->word, value, __ATOMIC_SEQ_CST);
  }
  state_->cv.notify_all();
}

std::uint32_t CudaHostSignal::value() const noexcept {
  return __atomic_load_n(state_->word, __ATOMIC_ACQUIRE);
}

void CudaHostSignal::enqueue_wait(CudaStream& stream, std::uint32_t value) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->waited || host_signal_reached(value, state_->waited_max))
      state_->waited_max = value;
    state_->waited = true;
  }
  if (wait_value_ != nullptr) {
    ZRT_CUDA_CHECK(cudaSetDevice(device_));
    const CUresult code =
        wait_value_(stream.handle(), state_->device_word, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (code == CUDA_SUCCESS) return;
    if (code != CUDA_ERROR_NOT_SUPPORTED) {
      throw Error(__FILE__, __LINE__,
                  fmt::format("cuStreamWaitValue32 on stream '{}' failed: CUresult {}",
                              stream.name(), static_cast<int>(code)));
    }
    spdlog::info(
        "cuda:{}: cuStreamWaitValue32 is not supported here; streams wait for host "
        "signals in host callbacks",
        device_);
    wait_value_ = nullptr;
  }
  std::shared_ptr<State> state = state_;
  stream.host_callback([state, value] {
    std::unique_lock<std::mutex> lock(state->mutex);
    state->cv.wait(lock, [&] {
      return host_signal_reached(__atomic_load_n(state->word, __ATOMIC_ACQUIRE), value);
    });
  });
}

// ---- CudaStream ------------------------------------------------------------------------------

struct CudaStream::TimingEvent {
  cudaEvent_t event = nullptr;
  explicit TimingEvent(int device) {
    ZRT_CUDA_CHECK(cudaSetDevice(device));
    ZRT_CUDA_CHECK(cudaEventCreate(&event));  // timing enabled
  }
  ~TimingEvent() {
    if (const cudaError_t code = cudaEventDestroy(event); code != cudaSuccess) {
      spdlog::error("cudaEventDestroy of a trace event failed: {}", cudaGetErrorString(code));
    }
  }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
};

CudaStream::CudaStream(std::string name, int device, std::function<void(CudaStream*)> on_destroy)
    : name_(std::move(name)), device_(device), on_destroy_(std::move(on_destroy)) {
  ZRT_CUDA_CHECK(cudaSetDevice(device_));
  ZRT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  if (t_in_cuda_host_callback) {
    spdlog::error("stream '{}' destroyed from a host callback; leaking it", name_);
  } else {
    cudaError_t code = cudaSetDevice(device_);
    if (code == cudaSuccess) code = cudaStreamSynchronize(stream_);
    if (code != cudaSuccess) {
      spdlog::error("stream '{}': waiting for its work before destruction failed: {}", name_,
                    cudaGetErrorString(code));
    }
    code = cudaStreamDestroy(stream_);
    if (code != cudaSuccess) {
      spdlog::error("cudaStreamDestroy of stream '{}' failed: {}", name_, cudaGetErrorString(code));
    }
  }
  if (on_destroy_) on_destroy_(this);
}

void CudaStream::wait(const Event& event) {
  check_not_in_cuda_host_callback("Stream::wait");
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  ZRT_CHECK(cuda_event != nullptr, "stream '{}' cannot wait on an event of another backend", name_);
  // CUDA binds the wait to the event's most recent record at the time of this call, and a wait
  // on a never-recorded event is a no-op: exactly stream.h's semantics.
  ZRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event->handle(), 0));
}

void CudaStream::wait(const HostSignal& signal, std::uint32_t value) {
  check_not_in_cuda_host_callback("Stream::wait");
  const auto* cuda_signal = dynamic_cast<const CudaHostSignal*>(&signal);
  ZRT_CHECK(cuda_signal != nullptr, "stream '{}' cannot wait on a host signal of another backend",
            name_);
  const_cast<CudaHostSignal*>(cuda_signal)->enqueue_wait(*this, value);
}

void CudaStream::synchronize() {
  check_not_in_cuda_host_callback("Stream::synchronize");
  ZRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  rethrow_error();
}

void CudaStream::rethrow_error() const {
  if (auto error = errors_->error_before(UINT64_MAX)) std::rethrow_exception(error);
}

void CudaStream::trace_begin(TraceRecorder& recorder, TraceTrack track, std::string label) {
  check_not_in_cuda_host_callback("Stream::trace_begin");
  trace_end();  // spans do not nest
  if (reference_recorder_ != recorder.id()) {
    // Once per recorder: a reference event whose host time is known.
    auto reference = std::make_shared<TimingEvent>(device_);
    ZRT_CUDA_CHECK(cudaEventRecord(reference->event, stream_));
    ZRT_CUDA_CHECK(cudaEventSynchronize(reference->event));
    reference_us_ = recorder.now_us();
    reference_ = std::move(reference);
    reference_recorder_ = recorder.id();
  }
  auto begin = std::make_shared<TimingEvent>(device_);
  ZRT_CUDA_CHECK(cudaEventRecord(begin->event, stream_));
  span_ = OpenSpan{&recorder, track, std::move(label), std::move(begin)};
}

void CudaStream::trace_end() {
  check_not_in_cuda_host_callback("Stream::trace_end");
  if (span_.recorder == nullptr) return;
  OpenSpan span = std::move(span_);
  span_ = OpenSpan{};
  auto end = std::make_shared<TimingEvent>(device_);
  ZRT_CUDA_CHECK(cudaEventRecord(end->event, stream_));
  span.recorder->add_deferred([reference = reference_, reference_us = reference_us_,
                               begin = span.begin, end, track = span.track, label = span.label]() {
    ZRT_CUDA_CHECK(cudaEventSynchronize(end->event));
    float from_reference_ms = 0.f;
    float duration_ms = 0.f;
    ZRT_CUDA_CHECK(cudaEventElapsedTime(&from_reference_ms, reference->event, begin->event));
    ZRT_CUDA_CHECK(cudaEventElapsedTime(&duration_ms, begin->event, end->event));
    return TraceEvent{track, label, reference_us + 1e3 * from_reference_ms, 1e3 * duration_ms, {}};
  });
}

void CudaStream::host_callback(std::function<void()> fn) {
  check_not_in_cuda_host_callback("Stream::host_callback");
  auto callback = std::make_unique<HostCallback>(
      HostCallback{std::move(fn), errors_, errors_->next_callback(), name_});
  ZRT_CUDA_CHECK(cudaLaunchHostFunc(stream_, run_host_callback, callback.get()));
  callback.release();  // the trampoline owns it now
}

// ---- CudaEvent -------------------------------------------------------------------------------

CudaEvent::CudaEvent(int device, EventWait wait) : device_(device) {
  ZRT_CUDA_CHECK(cudaSetDevice(device));
  const unsigned flags =
      cudaEventDisableTiming | (wait == EventWait::kBlock ? cudaEventBlockingSync : 0u);
  ZRT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags));
}

CudaEvent::~CudaEvent() {
  // Destroying an event whose record is pending is legal: CUDA releases it once it completes.
  const cudaError_t code = cudaEventDestroy(event_);
  if (code != cudaSuccess) spdlog::error("cudaEventDestroy failed: {}", cudaGetErrorString(code));
}

void CudaEvent::record(Stream& stream) {
  check_not_in_cuda_host_callback("Event::record");
  CudaStream& cuda = as_cuda_stream(stream, "Event::record");
  ZRT_CUDA_CHECK(cudaEventRecord(event_, cuda.handle()));
  recorded_errors_ = cuda.errors();
  recorded_callbacks_ = cuda.errors()->enqueued();
}

void CudaEvent::synchronize() {
  check_not_in_cuda_host_callback("Event::synchronize");
  ZRT_CUDA_CHECK(cudaSetDevice(device_));        // a no-op on the device's own thread
  ZRT_CUDA_CHECK(cudaEventSynchronize(event_));  // returns at once if never recorded
  if (recorded_errors_) {
    if (auto error = recorded_errors_->error_before(recorded_callbacks_)) {
      std::rethrow_exception(error);
    }
  }
}

bool CudaEvent::query() const {
  return cuda_event_complete(event_);
}

// ---- CudaDevice ------------------------------------------------------------------------------

CudaDevice& as_cuda_device(Device& device, const char* what) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  ZRT_CHECK(cuda != nullptr, "{}: device '{}' is not a CUDA device", what, device.description());
  return *cuda;
}

CudaStream& as_cuda_stream(Stream& stream, const char* what) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  ZRT_CHECK(cuda != nullptr, "{}: stream '{}' is not a CUDA stream", what, stream.name());
  return *cuda;
}

cudaStream_t cuda_stream_handle(Stream& stream) {
  return as_cuda_stream(stream, "cuda_stream_handle").handle();
}

namespace {
cudaDeviceProp device_properties(int index) {
  cudaDeviceProp props{};
  ZRT_CUDA_CHECK(cudaSetDevice(index));
  ZRT_CUDA_CHECK(cudaGetDeviceProperties(&props, index));
  return props;
}
}  // namespace

CudaDevice::CudaDevice(const DeviceOptions& options)
    : CudaDevice(options, device_properties(options.index)) {}

CudaDevice::CudaDevice(const DeviceOptions& options, const cudaDeviceProp& props)
    : Device(options.memory_limit_bytes > 0 ? options.memory_limit_bytes
                                            : static_cast<std::int64_t>(props.totalGlobalMem)),
      index_(options.index),
      name_(props.name),
      total_memory_(static_cast<std::int64_t>(props.totalGlobalMem)),
      registers_host_memory_(props.hostRegisterSupported != 0 &&
                             props.canUseHostPointerForRegisteredMem != 0),
      poison_allocations_(options.poison_allocations) {
  // Before anything runs on it: a GPU this build has no kernels for fails here, saying how to
  // rebuild, instead of at the first launch with CUDA's "no kernel image is available".
  if (const auto problem =
          cuda_architecture_problem(props.major, props.minor, ZRT_CUDA_ARCHITECTURES)) {
    ZRT_THROW(InvalidArgument, "cuda:{} ({}): {}", options.index, props.name, *problem);
  }
  if (options.memory_limit_bytes > total_memory_) {
    spdlog::warn(
        "cuda:{}: memory limit {} exceeds the GPU's {}; allocations beyond the GPU's "
        "memory fail in the CUDA allocator",
        index_, format_bytes(options.memory_limit_bytes), format_bytes(total_memory_));
  }
  if (options.stream_delay_max_us > 0) {
    spdlog::debug("cuda:{}: stream_delay_max_us applies to the CPU backend only; ignored", index_);
  }
  activate();
  // Keep freed memory in the pool (up to the capacity) instead of returning it to the driver at
  // every synchronization: a training step frees and reallocates the same sizes every time.
  cudaMemPool_t pool = nullptr;
  ZRT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
  std::uint64_t threshold = static_cast<std::uint64_t>(tracker_.capacity());
  ZRT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  ZRT_CUDA_CHECK(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking));
  // Stream memory operations through the runtime: version 12000 asks for the CUDA 12 ABI of
  // cuStreamWaitValue32 (its _v2).
  void* wait_value = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t code = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &wait_value,
                                                            12000, cudaEnableDefault, &found);
  if (code == cudaSuccess && found == cudaDriverEntryPointSuccess && wait_value != nullptr) {
    wait_value_ = reinterpret_cast<CuStreamWaitValue32>(wait_value);
  } else {
    cudaGetLastError();
    spdlog::info(
        "cuda:{}: the driver offers no cuStreamWaitValue32 ({}); streams wait for host "
        "signals in host callbacks",
        index_, code == cudaSuccess ? "symbol not found" : cudaGetErrorString(code));
  }
}

CudaDevice::~CudaDevice() {
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    if (!streams_.empty()) {
      spdlog::error("CudaDevice destroyed while {} of its streams are alive", streams_.size());
    }
  }
  reap_host_frees(/*wait=*/true);
  if (cudaSetDevice(index_) == cudaSuccess) {
    cudaError_t code = cudaStreamSynchronize(alloc_stream_);
    if (code == cudaSuccess) code = cudaStreamDestroy(alloc_stream_);
    if (code != cudaSuccess) {
      spdlog::error("cuda:{}: destroying the allocation stream failed: {}", index_,
                    cudaGetErrorString(code));
    }
  }
}

void CudaDevice::activate() const {
  ZRT_CUDA_CHECK(cudaSetDevice(index_));
}

std::string CudaDevice::description() const {
  if (tracker_.capacity() != total_memory_) {
    return fmt::format("cuda:{} {} (capacity {} of {})", index_, name_,
                       format_bytes(tracker_.capacity()), format_bytes(total_memory_));
  }
  return fmt::format("cuda:{} {}", index_, name_);
}

Buffer CudaDevice::allocate(std::int64_t bytes, MemCategory category, const std::string& label,
                            MemorySpace space, Stream* order) {
  check_not_in_cuda_host_callback("Device::allocate");
  reap_host_frees(/*wait=*/false);
  tracker_.on_allocate(space, category, bytes, label);  // throws OutOfMemory over capacity
  void* ptr = nullptr;
  std::string out_of_memory;
  try {
    ptr = allocate_raw(bytes, label, space, order, &out_of_memory);
  } catch (...) {
    tracker_.on_free(space, category, bytes);
    throw;
  }
  if (ptr == nullptr) {
    tracker_.on_free(space, category, bytes);
    tracker_.throw_out_of_memory(space, category, bytes, label, out_of_memory);
  }
  return Buffer(this, ptr, bytes, space, category, order);
}

void* CudaDevice::allocate_raw(std::int64_t bytes, const std::string& label, MemorySpace space,
                               Stream* order, std::string* out_of_memory) {
  const std::size_t size = std::max<std::size_t>(static_cast<std::size_t>(bytes), 1);
  void* ptr = nullptr;
  switch (space) {
    case MemorySpace::kDevice: {
      activate();
      cudaStream_t stream =
          order != nullptr ? as_cuda_stream(*order, "Device::allocate").handle() : alloc_stream_;
      const cudaError_t code = cudaMallocAsync(&ptr, size, stream);
      if (is_cuda_oom(code)) {
        cudaGetLastError();  // not sticky, but keep it out of later checks
        std::size_t free = 0;
        std::size_t total = 0;
        cudaMemGetInfo(&free, &total);
        *out_of_memory =
            fmt::format("cudaMallocAsync failed ({}); the GPU reports {} free of {}",
                        cudaGetErrorString(code), format_bytes(static_cast<std::int64_t>(free)),
                        format_bytes(static_cast<std::int64_t>(total)));
        return nullptr;
      }
      ZRT_CUDA_CHECK(code);
      // In stream order, as the allocation itself (its own stream's later work sees it).
      if (poison_allocations_) ZRT_CUDA_CHECK(cudaMemsetAsync(ptr, 0xFF, size, stream));
      // Without an ordering stream the memory must be usable on every stream when we return.
      if (order == nullptr) ZRT_CUDA_CHECK(cudaStreamSynchronize(alloc_stream_));
      break;
    }
    case MemorySpace::kPinnedHost: {
      activate();
      if (registers_pinned(bytes)) {
        ptr = allocate_pinned(bytes, out_of_memory);
        if (ptr == nullptr) return nullptr;
        break;
      }
      const cudaError_t code = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
      if (is_cuda_oom(code)) {
        cudaGetLastError();
        *out_of_memory = fmt::format("cudaHostAlloc failed ({})", cudaGetErrorString(code));
        return nullptr;
      }
      ZRT_CUDA_CHECK(code);
      break;
    }
    case MemorySpace::kPageableHost:
      ptr = std::aligned_alloc(kAlignment, round_up(size, kAlignment));
      if (ptr == nullptr) {
        *out_of_memory = "the host allocation failed";
        return nullptr;
      }
      break;
  }
  if (reinterpret_cast<std::uintptr_t>(ptr) % kAlignment != 0) {
    // Never expected (the CUDA allocators align to at least 256 bytes); fail loudly if it does.
    Buffer undo(this, ptr, 0, space, MemCategory::kOther, order);
    ZRT_THROW(Error, "allocation for '{}' in {} is not {}-byte aligned", label,
              memory_space_name(space), kAlignment);
  }
  // Host memory: new, so no stream uses it yet (device memory was filled on its stream above).
  if (poison_allocations_ && space != MemorySpace::kDevice) std::memset(ptr, 0xFF, size);
  return ptr;
}

bool CudaDevice::registers_pinned(std::int64_t bytes) const {
  return registers_host_memory_ && uses_resident_host_pages(static_cast<std::size_t>(bytes));
}

void* CudaDevice::allocate_pinned(std::int64_t bytes, std::string* out_of_memory) {
  const auto size = static_cast<std::size_t>(bytes);
  void* ptr = map_resident_host_pages(size, out_of_memory);
  if (ptr == nullptr) return nullptr;
  // Default: mapped and portable on a system with unified addressing, as cudaHostAlloc's memory.
  const cudaError_t code = cudaHostRegister(ptr, size, cudaHostRegisterDefault);
  if (code != cudaSuccess) {
    cudaGetLastError();
    unmap_resident_host_pages(ptr, size);
    if (code == cudaErrorMemoryAllocation) {
      *out_of_memory = fmt::format("cudaHostRegister of {} failed ({})", format_bytes(bytes),
                                   cudaGetErrorString(code));
      return nullptr;
    }
    check_cuda(code, "cudaHostRegister(resident host pages, size, cudaHostRegisterDefault)",
               __FILE__, __LINE__);
  }
  return ptr;
}

void CudaDevice::free_pinned(void* ptr, std::int64_t bytes) noexcept {
  if (registers_pinned(bytes)) {
    const cudaError_t code = cudaHostUnregister(ptr);
    if (code != cudaSuccess) {
      // Still locked: unmapping it under the driver would be worse than leaking it.
      spdlog::error("cudaHostUnregister failed ({}); leaking {} of pinned host memory",
                    cudaGetErrorString(code), format_bytes(bytes));
      return;
    }
    unmap_resident_host_pages(ptr, static_cast<std::size_t>(bytes));
    return;
  }
  const cudaError_t code = cudaFreeHost(ptr);
  if (code != cudaSuccess) spdlog::error("cudaFreeHost failed: {}", cudaGetErrorString(code));
}

void CudaDevice::release(void* ptr, std::int64_t bytes, MemorySpace space, MemCategory category,
                         Stream* order) noexcept {
  tracker_.on_free(space, category, bytes);
  if (t_in_cuda_host_callback) {
    spdlog::error(
        "a {} buffer of {} was released inside a host callback, where CUDA calls are "
        "not allowed; leaking it",
        memory_space_name(space), format_bytes(bytes));
    return;
  }
  try {
    CudaStream* stream = nullptr;
    if (order != nullptr) {
      stream = dynamic_cast<CudaStream*>(order);
      if (stream == nullptr) {
        spdlog::error(
            "buffer released with ordering stream '{}' of another backend; "
            "synchronizing the device instead",
            order->name());
        activate();
        ZRT_CUDA_CHECK(cudaDeviceSynchronize());
      }
    }
    switch (space) {
      case MemorySpace::kDevice:
        activate();
        ZRT_CUDA_CHECK(cudaFreeAsync(ptr, stream != nullptr ? stream->handle() : alloc_stream_));
        break;
      case MemorySpace::kPinnedHost:
      case MemorySpace::kPageableHost:
        if (stream != nullptr) {
          activate();
          cudaEvent_t done = nullptr;
          ZRT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
          const cudaError_t code = cudaEventRecord(done, stream->handle());
          if (code != cudaSuccess) cudaEventDestroy(done);
          ZRT_CUDA_CHECK(code);
          std::lock_guard<std::mutex> lock(pending_mutex_);
          pending_.push_back(PendingHostFree{done, ptr, space, bytes});
        } else if (space == MemorySpace::kPinnedHost) {
          free_pinned(ptr, bytes);
        } else {
          std::free(ptr);
        }
        break;
    }
  } catch (const std::exception& e) {
    spdlog::error("releasing a {} buffer of {} failed: {}", memory_space_name(space),
                  format_bytes(bytes), e.what());
  }
  reap_host_frees(/*wait=*/false);
}

void CudaDevice::reap_host_frees(bool wait) noexcept {
  std::vector<PendingHostFree> ready;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (pending_.empty()) return;
    auto it = std::partition(pending_.begin(), pending_.end(), [wait](const PendingHostFree& p) {
      if (wait) return false;
      const cudaError_t code = cudaEventQuery(p.done);
      if (code != cudaErrorNotReady) return false;
      cudaGetLastError();  // see cuda_event_complete
      return true;         // keep the ones still in flight
    });
    ready.assign(it, pending_.end());
    pending_.erase(it, pending_.end());
  }
  for (const PendingHostFree& p : ready) {
    cudaError_t code = cudaEventSynchronize(p.done);  // immediate unless wait
    if (code != cudaSuccess) {
      spdlog::error("waiting to free host memory failed: {}", cudaGetErrorString(code));
    }
    cudaEventDestroy(p.done);
    if (p.space == MemorySpace::kPinnedHost) {
      free_pinned(p.ptr, p.bytes);
    } else {
      std::free(p.ptr);
    }
  }
}

std::unique_ptr<Stream> CudaDevice::create_stream(const std::string& name) {
  check_not_in_cuda_host_callback("Device::create_stream");
  auto stream =
      std::make_unique<CudaStream>(name, index_, [this](CudaStream* s) { forget_stream(s); });
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.push_back(stream.get());
  return stream;
}

void CudaDevice::forget_stream(CudaStream* stream) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.erase(std::remove(streams_.begin(), streams_.end(), stream), streams_.end());
}

std::unique_ptr<Event> CudaDevice::create_event(EventWait wait) {
  check_not_in_cuda_host_callback("Device::create_event");
  return std::make_unique<CudaEvent>(index_, wait);
}

std::unique_ptr<HostSignal> CudaDevice::create_host_signal() {
  check_not_in_cuda_host_callback("Device::create_host_signal");
  return std::make_unique<CudaHostSignal>(index_, wait_value_);
}

void CudaDevice::copy(DevicePtr<std::byte> dst, DevicePtr<const std::byte> src, std::size_t bytes,
                      Stream& stream) {
  check_not_in_cuda_host_callback("Device::copy");
  cudaStream_t s = as_cuda_stream(stream, "Device::copy").handle();
  if (bytes == 0) return;
  activate();
  ZRT_CUDA_CHECK(cudaMemcpyAsync(device_access::raw(dst), device_access::raw(src), bytes,
                                 cudaMemcpyDeviceToDevice, s));
}

void CudaDevice::copy_to_device(DevicePtr<std::byte> dst, const void* src, std::size_t bytes,
                                Stream& stream) {
  check_not_in_cuda_host_callback("Device::copy_to_device");
  cudaStream_t s = as_cuda_stream(stream, "Device::copy_to_device").handle();
  if (bytes == 0) return;
  activate();
  ZRT_CUDA_CHECK(cudaMemcpyAsync(device_access::raw(dst), src, bytes, cudaMemcpyHostToDevice, s));
}

void CudaDevice::copy_to_host(void* dst, DevicePtr<const std::byte> src, std::size_t bytes,
                              Stream& stream) {
  check_not_in_cuda_host_callback("Device::copy_to_host");
  cudaStream_t s = as_cuda_stream(stream, "Device::copy_to_host").handle();
  if (bytes == 0) return;
  activate();
  ZRT_CUDA_CHECK(cudaMemcpyAsync(dst, device_access::raw(src), bytes, cudaMemcpyDeviceToHost, s));
}

void CudaDevice::fill_zero(DevicePtr<std::byte> dst, std::size_t bytes, Stream& stream) {
  check_not_in_cuda_host_callback("Device::fill_zero");
  cudaStream_t s = as_cuda_stream(stream, "Device::fill_zero").handle();
  if (bytes == 0) return;
  activate();
  ZRT_CUDA_CHECK(cudaMemsetAsync(device_access::raw(dst), 0, bytes, s));
}

void CudaDevice::synchronize() {
  check_not_in_cuda_host_callback("Device::synchronize");
  activate();
  ZRT_CUDA_CHECK(cudaDeviceSynchronize());
  reap_host_frees(/*wait=*/false);
  std::vector<CudaStream*> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    streams = streams_;
  }
  for (CudaStream* s : streams) s->rethrow_error();
}

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options) {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess || count == 0) {
    cudaGetLastError();
    ZRT_THROW(Error,
              "device type 'cuda' requested but no CUDA device is usable ({}); run on a GPU node "
              "or use the cpu device",
              code != cudaSuccess ? fmt::format("cudaGetDeviceCount: {}, error {}",
                                                cudaGetErrorString(code), static_cast<int>(code))
                                  : std::string("cudaGetDeviceCount found no device"));
  }
  if (options.index < 0 || options.index >= count) {
    ZRT_THROW(InvalidArgument,
              "CUDA device index {} is out of range: this process sees {} device(s) (check "
              "CUDA_VISIBLE_DEVICES and the number of ranks per node)",
              options.index, count);
  }
  return std::make_unique<CudaDevice>(options);
}

}  // namespace zrt
