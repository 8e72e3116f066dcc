// The state behind the CUDA runtime stand-in (tests only): devices, the pointer table, streams and
// events with happens-before clocks, and the error state the C API reports.
//
// What it checks, on every call (each failure names the call, the argument and the allocation):
// - every pointer lies inside a live allocation of the kind the call needs (device memory from
//   cudaMalloc/cudaMallocAsync, pinned host memory from cudaHostAlloc or cudaHostRegister, or
//   pageable memory, i.e.
//   anything else), with the whole range [p, p + bytes) in bounds;
// - stream order: each device or pinned allocation remembers, by byte range, the operations
//   that read or wrote it and are not yet known complete by the host. An operation on stream S that
//   touches it conflicts (read/write, write/read, write/write) with an earlier one on stream T != S
//   unless that one happens before S's current position: through cudaStreamWaitEvent on an event
//   recorded after it, or a host synchronization (stream, event, device) followed by the enqueue.
//   Vector clocks make this independent of timing: a missing event wait is reported even when the
//   race did not bite. Freeing (cudaFreeAsync: on its stream; cudaFreeHost: on the host) counts as
//   a write.
//
// Streams are zrt's CPU streams (runtime/device/cpu_stream.h): one worker thread each, CUDA's
// event semantics, host callbacks. An operation that fails on a stream (a kernel twin finding
// bad data) becomes the context's sticky error, as a device fault does in CUDA: every later call
// returns it.
//
// Environment: ZRT_STANDIN_DEVICES (device count, default 4), ZRT_STANDIN_DEVICE_MEMORY (bytes
// per device, default 16 GiB), ZRT_STANDIN_STREAM_DELAY_US (random delay before each stream
// operation, default 0), ZRT_STANDIN_COMPUTE_CAPABILITY (what cudaGetDeviceProperties reports,
// 10 x major + minor, default 90), ZRT_STANDIN_HOST_REGISTER (0: the devices report no
// cudaHostRegister usable at the host pointer; default 1), ZRT_STANDIN_CENSUS (a file: one
// tab-separated line per stream operation as it is enqueued, "stream, bytes read, bytes
// written, what", the bytes those its accesses declare; tools/bench/standin_census.py sums a
// step of them).
//
// Global mutable state is what a C runtime is; it is confined to this library (tests only).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/device/cpu_stream.h"

namespace zrt::standin {

// A failed API call: the code to return and the message naming the call.
class ApiError : public std::runtime_error {
 public:
  ApiError(int code, const std::string& message) : std::runtime_error(message), code(code) {}
  int code;
};

// Throws ApiError(cudaErrorInvalidValue-like code) with "call: message".
[[noreturn]] void fail(int code, const std::string& call, const std::string& message);

enum class MemKind { kDevice, kPinned, kPageable };
const char* mem_kind_name(MemKind k);

// An enqueued operation: which stream, its sequence number there, and what it was.
struct OpStamp {
  int stream = -1;
  std::uint64_t seq = 0;
  std::string what;
};

using VectorClock = std::vector<std::uint64_t>;  // per stream id: highest seq known complete

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  MemKind kind = MemKind::kDevice;
  int device = 0;
  std::uint64_t id = 0;
  std::string freed_by;     // non-empty once freed (memory released when the free runs)
  bool registered = false;  // cudaHostRegister: the program's memory, never freed here
  // Accesses not yet known complete by the host, by byte range: [lo, hi) of operation op.
  struct Record {
    std::uintptr_t lo, hi;
    OpStamp op;
    bool write;
  };
  std::vector<Record> history;
};

// One memory access of an operation.
struct Access {
  const void* ptr = nullptr;
  std::size_t bytes = 0;
  bool write = false;
  const char* arg = "";  // argument name, for messages
  // The bytes the operation moves when fewer than the range it spans (a strided matrix's
  // rows x cols elements, not its (cols - 1) x ld + rows); 0: all of `bytes`. The census only.
  std::size_t moved = 0;
};

struct StreamState {
  int id = 0;
  int device = 0;
  std::string name;
  std::unique_ptr<CpuStream> impl;
  std::uint64_t seq = 0;
  VectorClock knows;
};

struct EventState {
  int device = 0;
  CpuEvent impl;
  VectorClock clock;
  bool recorded = false;
  unsigned flags = 0;  // cudaEventDisableTiming etc., as created
  // When the stream reached the last record (steady clock, ms), written by stream work enqueued
  // just before it: what cudaEventElapsedTime reads. Shared so pending work outlives a destroy.
  std::shared_ptr<std::atomic<double>> reached_ms = std::make_shared<std::atomic<double>>(0.0);
};

class Runtime {
 public:
  static Runtime& get();

  int device_count() const { return device_count_; }
  std::size_t device_memory() const { return device_memory_; }
  // The compute capability the devices report, 10 x major + minor (ZRT_STANDIN_COMPUTE_CAPABILITY,
  // default 90: an H100's).
  int compute_capability() const { return compute_capability_; }
  // Whether the devices report cudaHostRegister usable at the host pointer
  // (ZRT_STANDIN_HOST_REGISTER, default 1; 0 makes a program fall back to cudaHostAlloc).
  bool host_register() const { return host_register_; }
  int current_device();            // this thread's device
  void set_current_device(int d);  // throws ApiError if out of range

  // ---- memory ----
  void* allocate(std::size_t bytes, MemKind kind, const std::string& call);
  // cudaHostRegister: [p, p + bytes) of the program's pageable memory becomes pinned; throws
  // ApiError if it overlaps memory the runtime knows.
  void register_host(void* p, std::size_t bytes, const std::string& call);
  // Finds the allocation containing p (live or freed-pending), or null (pageable memory).
  Allocation* find(const void* p);
  // Checks [p, p+bytes) against the kinds `allowed` (pageable = not in the table); returns the
  // kind found. Must be called with mutex() held. in_stream_order: the check runs inside stream
  // work, where memory freed by a cudaFreeAsync enqueued later is still valid.
  MemKind check_range(const std::string& call, const char* arg, const void* p, std::size_t bytes,
                      std::initializer_list<MemKind> allowed, bool in_stream_order = false);
  std::size_t device_bytes_in_use(int device);

  // ---- streams and events ----
  StreamState* stream(cudaStream_t s, const std::string& call);  // 0: the device's default stream
  cudaStream_t create_stream(const std::string& call);
  void destroy_stream(cudaStream_t s, const std::string& call);
  EventState* event(cudaEvent_t e, const std::string& call);
  cudaEvent_t create_event();
  void destroy_event(cudaEvent_t e, const std::string& call);

  // Enqueues `work` on `s` as operation `what` touching `accesses` (checked and recorded for
  // hazards first; throws ApiError naming `call`). Returns the completion of the operation.
  // Caller holds mutex(). host_fn: run `work` as a host callback (it may not call the API).
  std::shared_ptr<CpuCompletion> enqueue(StreamState& s, const std::string& call,
                                         const std::string& what,
                                         const std::vector<Access>& accesses,
                                         std::function<void()> work, bool host_fn = false);
  // A host-side operation touching `accesses` (freeing pinned memory): checks that every
  // earlier operation on them is known complete by the host.
  void host_access(const std::string& call, const std::vector<Access>& accesses);

  void record(EventState& e, StreamState& s);
  void wait(StreamState& s, EventState& e);
  // Host learned that everything `clock` covers is complete.
  void host_learns(const VectorClock& clock);
  // A host wait (stream, event or device synchronization, a blocking copy) is about to wait for
  // everything `covered` names. Counts, for the calling thread, each stream it drains: one whose
  // every enqueued operation it covers, past the last drain this thread counted there. Such a
  // wait leaves that stream idle on a GPU until the host enqueues more, which is what "no host
  // synchronization inside a step" forbids; waiting for an older point (a double buffer's
  // previous copy) is not a drain. Deterministic: it depends on the order of this thread's calls,
  // not on timing. Caller holds mutex().
  void note_host_wait(const VectorClock& covered);
  // The calling thread's drain counts, by stream handle.
  std::vector<std::pair<cudaStream_t, long long>> host_drains();
  // Blocks until all streams of `device` are idle; rethrows a stream failure.
  void synchronize_device(int device);
  void synchronize_stream(StreamState& s);

  // Releases memory of a freed allocation (called from the stream that frees it).
  void release(std::uintptr_t base);

  std::mutex& mutex() { return mutex_; }

  // The sticky context error, set when stream work fails (empty message: none).
  void set_sticky(int code, const std::string& message);
  std::optional<std::pair<int, std::string>> sticky();

  // A stream failure rethrown by a synchronization, as an ApiError naming `call`.
  [[noreturn]] void rethrow_stream_failure(std::exception_ptr error, const std::string& call);

 private:
  Runtime();
  void check_hazards(const std::string& call, const std::string& what, int stream,
                     const VectorClock& knows, const std::vector<Access>& accesses);
  void note_accesses(const OpStamp& op, const std::vector<Access>& accesses);
  static bool ordered(const VectorClock& knows, const OpStamp& op);

  std::mutex mutex_;
  std::FILE* census_ = nullptr;  // ZRT_STANDIN_CENSUS, written under mutex_
  int device_count_ = 4;
  std::size_t device_memory_ = std::size_t{16} << 30;
  int compute_capability_ = 90;
  bool host_register_ = true;
  int delay_us_ = 0;
  std::map<std::uintptr_t, Allocation> allocations_;
  std::map<std::uintptr_t, std::string> freed_ranges_;  // base -> description (for messages)
  std::uint64_t next_allocation_ = 1;
  std::vector<std::unique_ptr<StreamState>> streams_;  // index = id; null once destroyed
  std::vector<StreamState*> default_streams_;          // per device, created lazily
  std::vector<std::unique_ptr<EventState>> events_;    // owned; null once destroyed
  VectorClock host_knows_;
  std::mutex sticky_mutex_;
  int sticky_code_ = 0;
  std::string sticky_message_;
};

// Runs an API body: returns cudaSuccess, or the ApiError's code after logging its message and
// making it this thread's last error (cudaGetLastError) and the text cudaGetErrorString gives.
// Checks the sticky context error first unless `ignore_sticky`.
cudaError_t api(const char* call, const std::function<void()>& body, bool ignore_sticky = false);
// The detailed message of the last error of `code` on this thread, or null.
const char* detail_for(int code);
void set_last_error(int code, const std::string& message);
int take_last_error();  // cudaGetLastError: returns and resets
int peek_last_error();

// "0x1234 (allocation #3 of 1024 B device memory at 0x1200, offset 0x34)".
std::string describe_pointer(const void* p);

}  // namespace zrt::standin
