// DevicePtr<T>: an address in device memory that host code cannot dereference.
//
// On a GPU, dereferencing device memory on the host crashes; on the CPU backend it would
// silently work and hide the bug. So device addresses are this opaque type: host code can
// offset them and pass them around, and only kernels, copies and collectives unwrap them
// through device_access::raw() (include "runtime/device/device_access.h", which host-side
// engine code must not).
#pragma once

#include <cstddef>
#include <type_traits>

namespace zrt {

template <typename T>
class DevicePtr;

namespace device_access {
template <typename T>
T* raw(DevicePtr<T> p);
template <typename T>
DevicePtr<T> wrap(T* p);
}  // namespace device_access

template <typename T>
class DevicePtr {
 public:
  DevicePtr() = default;

  // Element offset (byte offset for T = std::byte).
  DevicePtr operator+(std::ptrdiff_t elements) const { return DevicePtr(p_ + elements); }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const DevicePtr& o) const { return p_ == o.p_; }
  bool operator!=(const DevicePtr& o) const { return p_ != o.p_; }

  // Reinterprets the address as another element type (the caller vouches for alignment).
  template <typename U>
  DevicePtr<U> as() const {
    return device_access::wrap(reinterpret_cast<U*>(const_cast<std::remove_const_t<T>*>(p_)));
  }
  // Implicit conversion to a pointer-to-const.
  operator DevicePtr<const T>() const { return device_access::wrap(static_cast<const T*>(p_)); }

 private:
  explicit DevicePtr(T* p) : p_(p) {}
  T* p_ = nullptr;
  template <typename U>
  friend U* device_access::raw(DevicePtr<U>);
  template <typename U>
  friend DevicePtr<U> device_access::wrap(U*);
};

}  // namespace zrt
