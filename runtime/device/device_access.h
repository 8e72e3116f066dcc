// Unwraps DevicePtr for code that legitimately touches device memory: kernels, memory copies,
// collectives and backend implementations. Engine and model code must not include this.
#pragma once

#include "runtime/device/device_ptr.h"

namespace zrt::device_access {

template <typename T>
T* raw(DevicePtr<T> p) {
  return p.p_;
}
template <typename T>
DevicePtr<T> wrap(T* p) {
  return DevicePtr<T>(p);
}

}  // namespace zrt::device_access
