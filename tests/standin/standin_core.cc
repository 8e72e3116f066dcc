#include "tests/standin/standin_core.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

namespace zrt::standin {

namespace {

constexpr std::size_t kAlignment = 256;
constexpr std::uintptr_t kStreamTag = 0x5a00000000ull;
constexpr std::uintptr_t kEventTag = 0x5e00000000ull;

thread_local int t_device = 0;
thread_local int t_last_error = 0;
thread_local std::map<int, std::string>* t_details = nullptr;

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || parsed < 0) {
    spdlog::error("CUDA stand-in: {}='{}' is not a non-negative integer; using {}", name, v,
                  fallback);
    return fallback;
  }
  return parsed;
}

std::string hex(std::uintptr_t v) {
  return fmt::format("{:#x}", v);
}

std::string describe(const Allocation& a) {
  return fmt::format("allocation #{} ({} B of {} memory at {}{})", a.id, a.bytes,
                     mem_kind_name(a.kind), hex(a.base),
                     a.kind == MemKind::kDevice ? fmt::format(" on device {}", a.device)
                     : a.registered             ? std::string(", registered")
                                                : std::string());
}

void join(VectorClock& into, const VectorClock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (std::size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

}  // namespace

void fail(int code, const std::string& call, const std::string& message) {
  throw ApiError(code, call + ": " + message);
}

const char* mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::kDevice:
      return "device";
    case MemKind::kPinned:
      return "pinned host";
    case MemKind::kPageable:
      return "pageable host";
  }
  return "?";
}

Runtime& Runtime::get() {
  static Runtime* runtime = new Runtime();  // never destroyed: streams may outlive static dtors
  return *runtime;
}

Runtime::Runtime() {
  device_count_ = static_cast<int>(env_long("ZRT_STANDIN_DEVICES", 4));
  device_memory_ = static_cast<std::size_t>(env_long("ZRT_STANDIN_DEVICE_MEMORY", long{16} << 30));
  delay_us_ = static_cast<int>(env_long("ZRT_STANDIN_STREAM_DELAY_US", 0));
  compute_capability_ = static_cast<int>(env_long("ZRT_STANDIN_COMPUTE_CAPABILITY", 90));
  host_register_ = env_long("ZRT_STANDIN_HOST_REGISTER", 1) != 0;
  if (const char* census = std::getenv("ZRT_STANDIN_CENSUS"); census != nullptr && *census != 0) {
    census_ = std::fopen(census, "w");
    if (census_ == nullptr) {
      spdlog::error("CUDA stand-in: ZRT_STANDIN_CENSUS='{}' cannot be written: {}", census,
                    std::strerror(errno));
    }
  }
  default_streams_.assign(static_cast<std::size_t>(device_count_), nullptr);
}

int Runtime::current_device() {
  return t_device;
}

void Runtime::set_current_device(int d) {
  if (d < 0 || d >= device_count_) {
    fail(cudaErrorInvalidDevice, "cudaSetDevice",
         fmt::format("device {} out of range: the stand-in has {} device(s) "
                     "(ZRT_STANDIN_DEVICES)",
                     d, device_count_));
  }
  t_device = d;
}

// ---- memory ----------------------------------------------------------------------------------

std::size_t Runtime::device_bytes_in_use(int device) {
  std::size_t total = 0;
  for (const auto& [base, a] : allocations_) {
    if (a.kind == MemKind::kDevice && a.device == device) total += a.bytes;
  }
  return total;
}

void* Runtime::allocate(std::size_t bytes, MemKind kind, const std::string& call) {
  const int device = current_device();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kind == MemKind::kDevice && device_bytes_in_use(device) + bytes > device_memory_) {
      fail(cudaErrorMemoryAllocation, call,
           fmt::format("{} B requested on device {}, {} of {} B in use", bytes, device,
                       device_bytes_in_use(device), device_memory_));
    }
  }
  const std::size_t size =
      (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, size);
  if (p == nullptr)
    fail(cudaErrorMemoryAllocation, call, fmt::format("{} B: host allocation failed", bytes));
  // Fresh device memory is garbage, not zeros: make reads of unwritten memory visible.
  if (kind == MemKind::kDevice) std::memset(p, 0xa5, size);
  std::lock_guard<std::mutex> lock(mutex_);
  Allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(p);
  a.bytes = bytes;
  a.kind = kind;
  a.device = device;
  a.id = next_allocation_++;
  // Forget freed ranges this allocation reuses.
  auto it = freed_ranges_.lower_bound(a.base);
  while (it != freed_ranges_.end() && it->first < a.base + size) it = freed_ranges_.erase(it);
  allocations_[a.base] = std::move(a);
  return p;
}

void Runtime::register_host(void* p, std::size_t bytes, const std::string& call) {
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  // Any live allocation overlapping [base, base + bytes): the first at or after base, or the
  // one before it if it reaches into the range.
  auto it = allocations_.lower_bound(base);
  Allocation* overlap = nullptr;
  if (it != allocations_.end() && it->first < base + bytes) overlap = &it->second;
  if (overlap == nullptr && it != allocations_.begin()) {
    --it;
    if (it->first + std::max<std::size_t>(it->second.bytes, 1) > base) overlap = &it->second;
  }
  if (overlap != nullptr) {
    fail(overlap->registered ? cudaErrorHostMemoryAlreadyRegistered : cudaErrorInvalidValue, call,
         fmt::format("[{}, +{} B) overlaps {}", p, bytes, describe(*overlap)));
  }
  Allocation a;
  a.base = base;
  a.bytes = bytes;
  a.kind = MemKind::kPinned;
  a.device = current_device();
  a.id = next_allocation_++;
  a.registered = true;
  auto freed = freed_ranges_.lower_bound(a.base);
  while (freed != freed_ranges_.end() && freed->first < a.base + bytes) {
    freed = freed_ranges_.erase(freed);
  }
  allocations_[a.base] = std::move(a);
}

Allocation* Runtime::find(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  // A zero-byte allocation still owns its base address.
  if (address >= a.base && address < a.base + std::max<std::size_t>(a.bytes, 1)) return &a;
  return nullptr;
}

std::string describe_pointer(const void* p) {
  Runtime& rt = Runtime::get();
  Allocation* a = rt.find(p);
  if (a == nullptr) return fmt::format("{} (pageable host memory)", p);
  return fmt::format("{} (offset {} in {})", p, reinterpret_cast<std::uintptr_t>(p) - a->base,
                     describe(*a));
}

MemKind Runtime::check_range(const std::string& call, const char* arg, const void* p,
                             std::size_t bytes, std::initializer_list<MemKind> allowed,
                             bool in_stream_order) {
  auto allows = [&](MemKind k) {
    return std::find(allowed.begin(), allowed.end(), k) != allowed.end();
  };
  std::string wanted;
  for (MemKind k : allowed)
    wanted += (wanted.empty() ? "" : " or ") + std::string(mem_kind_name(k));
  if (p == nullptr) {
    if (bytes == 0) return MemKind::kPageable;
    fail(cudaErrorInvalidValue, call, fmt::format("{} is null ({} B)", arg, bytes));
  }
  Allocation* a = find(p);
  if (a == nullptr) {
    if (allows(MemKind::kPageable)) return MemKind::kPageable;
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    auto it = freed_ranges_.upper_bound(address);
    if (it != freed_ranges_.begin()) {
      --it;
      if (address <
          it->first + std::max<std::size_t>(1, std::strtoull(it->second.c_str(), nullptr, 10))) {
        fail(cudaErrorInvalidValue, call,
             fmt::format("{} {} points into freed memory: {}", arg, p,
                         it->second.substr(it->second.find(' ') + 1)));
      }
    }
    fail(cudaErrorInvalidValue, call,
         fmt::format("{} {} is not {} memory (no live allocation contains it)", arg, p, wanted));
  }
  if (!a->freed_by.empty() && !in_stream_order) {
    fail(cudaErrorInvalidValue, call,
         fmt::format("{} {} is in {}, already freed by {} (use after free)", arg, p, describe(*a),
                     a->freed_by));
  }
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(p);
  if (address + bytes > a->base + a->bytes) {
    fail(cudaErrorInvalidValue, call,
         fmt::format("{} [{}, +{} B) runs past the end of {} by {} B (out of bounds)", arg, p,
                     bytes, describe(*a), address + bytes - (a->base + a->bytes)));
  }
  if (!allows(a->kind)) {
    fail(cudaErrorInvalidValue, call,
         fmt::format("{} {} is {} memory ({}), but the call needs {} memory", arg, p,
                     mem_kind_name(a->kind), describe(*a), wanted));
  }
  return a->kind;
}

void Runtime::release(std::uintptr_t base) {
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.find(base);
    if (it == allocations_.end()) return;
    // "<bytes> <description>": the size first, parsed back by check_range.
    freed_ranges_[base] = fmt::format("{} {} (freed by {})", it->second.bytes, describe(it->second),
                                      it->second.freed_by);
    // Registered memory is the program's: unregistering leaves it allocated.
    if (!it->second.registered) p = reinterpret_cast<void*>(base);
    allocations_.erase(it);
  }
  std::free(p);
}

// ---- streams and events ------------------------------------------------------------------------

StreamState* Runtime::stream(cudaStream_t s, const std::string& call) {
  const auto handle = reinterpret_cast<std::uintptr_t>(s);
  if (handle == 0 || handle == 1 || handle == 2) {  // legacy / per-thread default stream
    const int device = current_device();
    if (default_streams_[static_cast<std::size_t>(device)] == nullptr) {
      auto state = std::make_unique<StreamState>();
      state->id = static_cast<int>(streams_.size());
      state->device = device;
      state->name = fmt::format("default stream of device {}", device);
      state->impl = std::make_unique<CpuStream>(state->name, delay_us_, 7919 + state->id);
      default_streams_[static_cast<std::size_t>(device)] = state.get();
      streams_.push_back(std::move(state));
    }
    return default_streams_[static_cast<std::size_t>(device)];
  }
  if (handle < kStreamTag || handle - kStreamTag >= streams_.size() ||
      !streams_[handle - kStreamTag]) {
    fail(cudaErrorInvalidResourceHandle, call,
         fmt::format("stream {} is not a live stream (destroyed, or not a stream)",
                     static_cast<const void*>(s)));
  }
  return streams_[handle - kStreamTag].get();
}

cudaStream_t Runtime::create_stream(const std::string& /*call*/) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto state = std::make_unique<StreamState>();
  state->id = static_cast<int>(streams_.size());
  state->device = current_device();
  state->name = fmt::format("stream #{} of device {}", state->id, state->device);
  state->impl = std::make_unique<CpuStream>(state->name, delay_us_, 7919 + state->id);
  const int id = state->id;
  streams_.push_back(std::move(state));
  return reinterpret_cast<cudaStream_t>(kStreamTag + static_cast<std::uintptr_t>(id));
}

void Runtime::destroy_stream(cudaStream_t s, const std::string& call) {
  std::unique_ptr<StreamState> doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    StreamState* state = stream(s, call);
    if (default_streams_[static_cast<std::size_t>(state->device)] == state) {
      fail(cudaErrorInvalidResourceHandle, call, "the default stream cannot be destroyed");
    }
    doomed = std::move(streams_[static_cast<std::size_t>(state->id)]);
  }
  doomed.reset();  // drains its work (CUDA releases the stream once its work is done)
}

EventState* Runtime::event(cudaEvent_t e, const std::string& call) {
  const auto handle = reinterpret_cast<std::uintptr_t>(e);
  if (handle < kEventTag || handle - kEventTag >= events_.size() || !events_[handle - kEventTag]) {
    fail(cudaErrorInvalidResourceHandle, call,
         fmt::format("event {} is not a live event (destroyed, or not an event)",
                     static_cast<const void*>(e)));
  }
  return events_[handle - kEventTag].get();
}

cudaEvent_t Runtime::create_event() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto state = std::make_unique<EventState>();
  state->device = current_device();
  events_.push_back(std::move(state));
  return reinterpret_cast<cudaEvent_t>(kEventTag + events_.size() - 1);
}

void Runtime::destroy_event(cudaEvent_t e, const std::string& call) {
  std::unique_ptr<EventState> doomed;
  std::lock_guard<std::mutex> lock(mutex_);
  event(e, call);
  doomed = std::move(events_[reinterpret_cast<std::uintptr_t>(e) - kEventTag]);
}

bool Runtime::ordered(const VectorClock& knows, const OpStamp& op) {
  return op.stream >= 0 && static_cast<std::size_t>(op.stream) < knows.size() &&
         knows[static_cast<std::size_t>(op.stream)] >= op.seq;
}

void Runtime::check_hazards(const std::string& call, const std::string& what, int stream,
                            const VectorClock& knows, const std::vector<Access>& accesses) {
  auto stream_name = [&](int id) {
    return static_cast<std::size_t>(id) < streams_.size() && streams_[static_cast<std::size_t>(id)]
               ? streams_[static_cast<std::size_t>(id)]->name
               : fmt::format("stream #{} (destroyed)", id);
  };
  const std::string where = stream >= 0 ? "on " + stream_name(stream) : std::string("on the host");
  for (const Access& acc : accesses) {
    if (acc.ptr == nullptr || acc.bytes == 0) continue;
    Allocation* a = find(acc.ptr);
    if (a == nullptr) continue;
    const auto lo = reinterpret_cast<std::uintptr_t>(acc.ptr);
    const auto hi = lo + acc.bytes;
    for (const Allocation::Record& r : a->history) {
      if (r.hi <= lo || hi <= r.lo) continue;  // disjoint bytes
      if (!r.write && !acc.write) continue;    // two reads
      if (r.op.stream == stream || ordered(knows, r.op)) continue;
      fail(cudaErrorIllegalAddress, call,
           fmt::format("{} {} {} (bytes [{}, {}) of {}) {}, but {} on {} {} bytes [{}, {}) and "
                       "is not ordered before this (missing cudaStreamWaitEvent on an event "
                       "recorded after it, or a synchronization): a race",
                       what, acc.write ? "writes" : "reads", acc.arg, lo - a->base, hi - a->base,
                       describe(*a), where, r.op.what, stream_name(r.op.stream),
                       r.write ? "wrote" : "reads", r.lo - a->base, r.hi - a->base));
    }
  }
}

void Runtime::note_accesses(const OpStamp& op, const std::vector<Access>& accesses) {
  for (const Access& acc : accesses) {
    if (acc.ptr == nullptr || acc.bytes == 0) continue;
    Allocation* a = find(acc.ptr);
    if (a == nullptr) continue;
    const auto lo = reinterpret_cast<std::uintptr_t>(acc.ptr);
    const auto hi = lo + acc.bytes;
    // Forget what the host knows complete (ordered before every later operation), and what
    // this operation supersedes on its own stream.
    auto& h = a->history;
    h.erase(std::remove_if(h.begin(), h.end(),
                           [&](const Allocation::Record& r) {
                             return ordered(host_knows_, r.op) ||
                                    (r.op.stream == op.stream && r.lo >= lo && r.hi <= hi &&
                                     (acc.write || !r.write));
                           }),
            h.end());
    if (h.size() >= 4096) h.erase(h.begin());  // bound the memory of long unsynchronized runs
    h.push_back(Allocation::Record{lo, hi, op, acc.write});
  }
}

std::shared_ptr<CpuCompletion> Runtime::enqueue(StreamState& s, const std::string& call,
                                                const std::string& what,
                                                const std::vector<Access>& accesses,
                                                std::function<void()> work, bool host_fn) {
  check_not_in_host_callback(call.c_str());
  auto done = std::make_shared<CpuCompletion>();
  {
    // Caller holds mutex_ (see cudart_*.cc); the clocks advance under it.
    join(s.knows, host_knows_);
    check_hazards(call, what, s.id, s.knows, accesses);
    ++s.seq;
    if (s.knows.size() <= static_cast<std::size_t>(s.id)) s.knows.resize(s.id + 1, 0);
    s.knows[static_cast<std::size_t>(s.id)] = s.seq;
    note_accesses(OpStamp{s.id, s.seq, what}, accesses);
    if (census_ != nullptr) {
      std::size_t read = 0, written = 0;
      for (const Access& a : accesses) (a.write ? written : read) += a.moved ? a.moved : a.bytes;
      std::fprintf(census_, "%d\t%zu\t%zu\t%s\n", s.id, read, written, what.c_str());
      std::fflush(census_);  // a run that ends in an error keeps what it enqueued
    }
  }
  if (host_fn) {
    s.impl->host_callback(std::move(work));
    s.impl->enqueue_signal(done);
    return done;
  }
  std::string label = what;
  s.impl->enqueue([work = std::move(work), label, call, this] {
    try {
      work();
    } catch (const ApiError& e) {
      set_sticky(e.code, e.what());
      throw;
    } catch (const std::exception& e) {
      set_sticky(cudaErrorLaunchFailure,
                 fmt::format("{}: {} failed on the device: {}", call, label, e.what()));
      throw;
    }
  });
  s.impl->enqueue_signal(done);
  return done;
}

void Runtime::host_access(const std::string& call, const std::vector<Access>& accesses) {
  check_hazards(call, call, -1, host_knows_, accesses);
}

void Runtime::record(EventState& e, StreamState& s) {
  join(s.knows, host_knows_);
  e.clock = s.knows;
  e.recorded = true;
  e.impl.record(*s.impl);
}

void Runtime::wait(StreamState& s, EventState& e) {
  if (!e.recorded) return;  // a no-op, as in CUDA
  join(s.knows, e.clock);
  s.impl->wait(e.impl);
}

void Runtime::host_learns(const VectorClock& clock) {
  std::lock_guard<std::mutex> lock(mutex_);
  join(host_knows_, clock);
}

namespace {
// Per thread: for each stream id, the sequence number of the last drain counted and the count.
struct DrainCount {
  std::uint64_t last_seq = 0;
  long long count = 0;
};
thread_local std::vector<DrainCount> t_drains;
}  // namespace

void Runtime::note_host_wait(const VectorClock& covered) {
  for (std::size_t id = 0; id < covered.size() && id < streams_.size(); ++id) {
    const StreamState* s = streams_[id].get();
    if (s == nullptr || s->seq == 0 || covered[id] < s->seq) continue;
    if (t_drains.size() <= id) t_drains.resize(id + 1);
    DrainCount& d = t_drains[id];
    if (s->seq <= d.last_seq) continue;  // nothing enqueued since this thread's last drain
    d.last_seq = s->seq;
    ++d.count;
  }
}

std::vector<std::pair<cudaStream_t, long long>> Runtime::host_drains() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<cudaStream_t, long long>> out;
  for (std::size_t id = 0; id < t_drains.size(); ++id) {
    if (t_drains[id].count == 0) continue;
    const bool is_default = std::find(default_streams_.begin(), default_streams_.end(),
                                      streams_[id].get()) != default_streams_.end();
    out.emplace_back(is_default ? nullptr : reinterpret_cast<cudaStream_t>(kStreamTag + id),
                     t_drains[id].count);
  }
  return out;
}

void Runtime::synchronize_stream(StreamState& s) {
  VectorClock snapshot;
  CpuStream* impl = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot = s.knows;
    impl = s.impl.get();
    note_host_wait(snapshot);
  }
  try {
    impl->synchronize();
  } catch (...) {
    rethrow_stream_failure(std::current_exception(), "cudaStreamSynchronize");
  }
  host_learns(snapshot);
}

void Runtime::synchronize_device(int device) {
  std::vector<std::pair<CpuStream*, VectorClock>> targets;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    VectorClock covered;
    for (auto& s : streams_) {
      if (s && s->device == device) {
        targets.emplace_back(s->impl.get(), s->knows);
        join(covered, s->knows);
      }
    }
    note_host_wait(covered);
  }
  for (auto& [impl, clock] : targets) {
    try {
      impl->synchronize();
    } catch (...) {
      rethrow_stream_failure(std::current_exception(), "cudaDeviceSynchronize");
    }
    host_learns(clock);
  }
}

void Runtime::set_sticky(int code, const std::string& message) {
  std::lock_guard<std::mutex> lock(sticky_mutex_);
  if (sticky_code_ != 0) return;
  sticky_code_ = code;
  sticky_message_ = message;
  spdlog::error("CUDA stand-in: device fault (sticky, as in CUDA): {}", message);
}

std::optional<std::pair<int, std::string>> Runtime::sticky() {
  std::lock_guard<std::mutex> lock(sticky_mutex_);
  if (sticky_code_ == 0) return std::nullopt;
  return std::make_pair(sticky_code_, sticky_message_);
}

void Runtime::rethrow_stream_failure(std::exception_ptr error, const std::string& call) {
  try {
    std::rethrow_exception(error);
  } catch (const ApiError& e) {
    throw ApiError(e.code, call + ": earlier stream work failed: " + e.what());
  } catch (const std::exception& e) {
    throw ApiError(cudaErrorLaunchFailure, call + ": earlier stream work failed: " + e.what());
  }
}

// ---- errors ------------------------------------------------------------------------------------

void set_last_error(int code, const std::string& message) {
  t_last_error = code;
  if (t_details == nullptr) t_details = new std::map<int, std::string>();
  (*t_details)[code] = message;
}

int take_last_error() {
  const int code = t_last_error;
  t_last_error = 0;
  return code;
}

int peek_last_error() {
  return t_last_error;
}

const char* detail_for(int code) {
  if (t_details == nullptr) return nullptr;
  auto it = t_details->find(code);
  return it == t_details->end() ? nullptr : it->second.c_str();
}

cudaError_t api(const char* call, const std::function<void()>& body, bool ignore_sticky) {
  Runtime& rt = Runtime::get();
  if (!ignore_sticky) {
    if (auto sticky = rt.sticky()) {
      set_last_error(sticky->first, fmt::format("{}: the context has a sticky error from an "
                                                "earlier fault: {}",
                                                call, sticky->second));
      return static_cast<cudaError_t>(sticky->first);
    }
  }
  try {
    body();
    return cudaSuccess;
  } catch (const ApiError& e) {
    if (e.code != cudaErrorMemoryAllocation) spdlog::warn("CUDA stand-in: {}", e.what());
    set_last_error(e.code, e.what());
    return static_cast<cudaError_t>(e.code);
  } catch (const std::exception& e) {
    spdlog::warn("CUDA stand-in: {}: {}", call, e.what());
    set_last_error(cudaErrorUnknown, fmt::format("{}: {}", call, e.what()));
    return cudaErrorUnknown;
  }
}

}  // namespace zrt::standin
