// Large host buffers made resident up front by several threads, and whole-buffer fills and
// copies on the host's threads.
//
// Why: a large model's start-up is spent faulting in host memory on one thread. cudaHostAlloc
// backs and pins every page inside the driver, on the calling thread (~2 GB/s); the optimizer
// offload of Llama-3.1-8B holds ~67 GB there, and the state's zeroing and conversion ran on one
// thread after it. Pages faulted in by many threads at once, then page-locked with
// cudaHostRegister, take a fraction of that (runtime/device/cuda_device.cc); the CPU backend
// uses the same resident pages for its "pinned" memory, so the path runs in every test.
//
// Thread-safety: plain functions; the fills run an OpenMP team of the calling thread.
#pragma once

#include <cstddef>
#include <string>

namespace zrt {

// Buffers at least this large are mapped and pre-faulted; smaller ones go to the allocator
// (a mapping, and on CUDA a registration, costs more than faulting in a few MB).
constexpr std::size_t kResidentHostMinBytes = std::size_t{16} << 20;

inline bool uses_resident_host_pages(std::size_t bytes) {
  return bytes >= kResidentHostMinBytes;
}

// An anonymous private mapping of `bytes` (page-aligned), every page written (zero) once by the
// host's OpenMP threads so that it is resident when this returns. Null, with the reason in *error,
// when the mapping fails (out of memory).
void* map_resident_host_pages(std::size_t bytes, std::string* error);

// Releases a mapping made by map_resident_host_pages (the same `bytes`).
void unmap_resident_host_pages(void* ptr, std::size_t bytes) noexcept;

// How many of the host's OpenMP threads a pass over `bytes` uses: one per 64 MiB, at most the
// team's size (small buffers stay on the calling thread).
int host_pass_threads(std::size_t bytes);

// memset(ptr, 0, bytes) on host_pass_threads(bytes) threads.
void parallel_fill_zero(void* ptr, std::size_t bytes);

// `bytes` of zeros to read that cost no memory: a read-only anonymous mapping, never written, so
// every page is the kernel's one shared zero page. A checkpoint reads a frozen unit's optimizer
// state from it (ZeroEngine::host_state): as large as the unit's slice, backed by nothing.
class ZeroHostPages {
 public:
  ZeroHostPages() = default;
  explicit ZeroHostPages(std::size_t bytes);  // throws Error when the mapping fails
  ~ZeroHostPages();
  ZeroHostPages(ZeroHostPages&& other) noexcept;
  ZeroHostPages& operator=(ZeroHostPages&& other) noexcept;
  ZeroHostPages(const ZeroHostPages&) = delete;
  ZeroHostPages& operator=(const ZeroHostPages&) = delete;

  const void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace zrt
