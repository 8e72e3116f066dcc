// Buffer: RAII ownership of one allocation in device memory or in (pinned or pageable) host
// memory, tagged with a category for the MemoryTracker. Move-only.
//
// A device buffer exposes only a DevicePtr; a host buffer exposes a plain pointer. A buffer must
// not outlive the Device that allocated it. If it was allocated with an ordering stream, its
// release is ordered on that stream (as cudaFreeAsync): the owner must have made that stream
// wait for all other work that still uses the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/common/error.h"
#include "runtime/device/device_ptr.h"
#include "runtime/device/memory.h"

namespace zrt {

class Stream;

// Implemented by devices: takes an allocation back.
class BufferOwner {
 public:
  virtual void release(void* ptr, std::int64_t bytes, MemorySpace space, MemCategory category,
                       Stream* order) noexcept = 0;

 protected:
  ~BufferOwner() = default;
};

class Buffer {
 public:
  Buffer() = default;
  Buffer(BufferOwner* owner, void* ptr, std::int64_t bytes, MemorySpace space, MemCategory category,
         Stream* order)
      : owner_(owner),
        ptr_(ptr),
        bytes_(bytes),
        space_(space),
        category_(category),
        order_(order) {}
  ~Buffer() { reset(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      owner_ = o.owner_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      space_ = o.space_;
      category_ = o.category_;
      order_ = o.order_;
      o.owner_ = nullptr;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }

  // Releases the allocation now (stream-ordered if it has an ordering stream).
  void reset() noexcept {
    if (owner_ != nullptr) owner_->release(ptr_, bytes_, space_, category_, order_);
    owner_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
  }

  bool empty() const { return owner_ == nullptr; }
  std::int64_t bytes() const { return bytes_; }
  MemorySpace space() const { return space_; }
  MemCategory category() const { return category_; }
  bool on_device() const { return space_ == MemorySpace::kDevice; }

  // Number of whole elements of T the buffer holds.
  template <typename T>
  std::int64_t count() const {
    return bytes_ / static_cast<std::int64_t>(sizeof(T));
  }
  // The device address; throws if this is host memory.
  template <typename T>
  DevicePtr<T> device() const {
    ZRT_CHECK(on_device(), "host buffer ({}) used as device memory", memory_space_name(space_));
    return device_address<T>();
  }
  // The host address; throws if this is device memory.
  template <typename T>
  T* host() const {
    ZRT_CHECK(!on_device(), "device buffer dereferenced on the host; copy it to host memory first");
    return static_cast<T*>(ptr_);
  }

 private:
  template <typename T>
  DevicePtr<T> device_address() const;

  BufferOwner* owner_ = nullptr;
  void* ptr_ = nullptr;
  std::int64_t bytes_ = 0;
  MemorySpace space_ = MemorySpace::kDevice;
  MemCategory category_ = MemCategory::kOther;
  Stream* order_ = nullptr;
};

}  // namespace zrt

#include "runtime/device/device_access.h"

template <typename T>
zrt::DevicePtr<T> zrt::Buffer::device_address() const {
  return device_access::wrap(static_cast<T*>(ptr_));
}
