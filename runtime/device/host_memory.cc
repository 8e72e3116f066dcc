#include "runtime/device/host_memory.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"

namespace zrt {

namespace {
constexpr std::size_t kBytesPerThread = std::size_t{64} << 20;

std::size_t page_size() {
  const long size = sysconf(_SC_PAGESIZE);
  return size > 0 ? static_cast<std::size_t>(size) : 4096;
}
}  // namespace

int host_pass_threads(std::size_t bytes) {
  const std::size_t wanted = std::max<std::size_t>(1, bytes / kBytesPerThread);
  return static_cast<int>(
      std::min<std::size_t>(wanted, static_cast<std::size_t>(std::max(1, omp_get_max_threads()))));
}

void* map_resident_host_pages(std::size_t bytes, std::string* error) {
  const std::size_t page = page_size();
  const std::size_t length = (std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
  void* ptr = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) {
    *error = fmt::format("mmap of {} bytes failed: {}", length, std::strerror(errno));
    return nullptr;
  }
  // No MADV_HUGEPAGE: the system's transparent-huge-page policy decides. Asked for, huge pages
  // faulted in 4x slower than small ones on a VM whose host backs guest memory lazily (the
  // kernel takes them from memory not touched lately; BENCHMARKS "Start-up of a large model").
  //
  // One write per page makes it resident (the kernel hands out zeroed pages); each thread
  // faults in one contiguous range (where the system maps huge pages anyway, a thread faults in
  // whole ones).
  auto* bytes_of = static_cast<volatile unsigned char*>(ptr);
  const std::int64_t pages = static_cast<std::int64_t>(length / page);
#pragma omp parallel for schedule(static) num_threads(host_pass_threads(length))
  for (std::int64_t p = 0; p < pages; ++p) bytes_of[static_cast<std::size_t>(p) * page] = 0;
  return ptr;
}

void unmap_resident_host_pages(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  const std::size_t page = page_size();
  const std::size_t length = (std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
  if (munmap(ptr, length) != 0) {
    spdlog::error("munmap of {} bytes at {} failed: {}", length, ptr, std::strerror(errno));
  }
}

void parallel_fill_zero(void* ptr, std::size_t bytes) {
  // Pieces of 1 MiB, a contiguous run of them a thread (static schedule).
  constexpr std::size_t kPiece = std::size_t{1} << 20;
  auto* base = static_cast<unsigned char*>(ptr);
  const auto pieces = static_cast<std::int64_t>((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) num_threads(host_pass_threads(bytes))
  for (std::int64_t p = 0; p < pieces; ++p) {
    const std::size_t begin = static_cast<std::size_t>(p) * kPiece;
    std::memset(base + begin, 0, std::min(kPiece, bytes - begin));
  }
}

ZeroHostPages::ZeroHostPages(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  // MAP_NORESERVE: no commit charge either; a page read maps the shared zero page, and a write
  // (a bug) faults.
  data_ = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    ZRT_THROW(Error, "a read-only zero mapping of {} bytes failed: {}", bytes,
              std::strerror(errno));
  }
}

ZeroHostPages::~ZeroHostPages() {
  if (data_ != nullptr && munmap(data_, bytes_) != 0) {
    spdlog::error("munmap of {} bytes at {} failed: {}", bytes_, data_, std::strerror(errno));
  }
}

ZeroHostPages::ZeroHostPages(ZeroHostPages&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

ZeroHostPages& ZeroHostPages::operator=(ZeroHostPages&& other) noexcept {
  if (this != &other) {
    ZeroHostPages old(std::move(*this));
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

}  // namespace zrt
