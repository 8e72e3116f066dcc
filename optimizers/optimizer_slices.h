// What the code shared by the optimizers knows of each one's slice types (adam.h, lion.h): the
// optimizer's name for messages and its fp32 state arrays, named as members of the slice struct
// in the order of its spec().state_names. The fields every slice has (param, grad, param_out,
// numel, the dtypes, weight_decay) have the same names in all of them. From that, one piece of
// code validates a slice of any optimizer, converts the engine's generic slices
// (runtime/engine/optimizer_interface.h) to an optimizer's own, and device slices to host ones on
// the CPU backend (where device memory is host memory).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/common/dtype.h"
#include "runtime/device/device_access.h"
#include "runtime/device/device_ptr.h"

namespace zrt {

// Specialised after each slice struct (adam.h, lion.h), deriving from the optimizer's family:
//   static constexpr const char* kFamily;               "Adam", "Lion"
//   static constexpr std::array<const char*, N> kStateNames;
//   static constexpr std::array<P Slice::*, N> kStates;  the state members, in that order
template <typename Slice>
struct SliceTraits;

namespace detail {

template <typename Slice>
constexpr std::size_t kNumSliceStates = SliceTraits<Slice>::kStates.size();

// Pointers of either memory as raw pointers (device_access: the optimizers are kernels).
template <typename T>
T* raw_pointer(T* p) {
  return p;
}
template <typename T>
T* raw_pointer(DevicePtr<T> p) {
  return device_access::raw(p);
}

// The state pointers of `slice`, in spec order, as raw pointers.
template <typename Slice>
auto raw_states(const Slice& slice) {
  constexpr auto& members = SliceTraits<Slice>::kStates;
  std::array<float*, members.size()> states{};
  for (std::size_t k = 0; k < members.size(); ++k) states[k] = raw_pointer(slice.*members[k]);
  return states;
}

// Throws InvalidArgument naming slice `index` of `family` if numel < 0, or, for numel > 0, if a
// pointer is null (the message lists param, grad and `state_names`) or a dtype is not fp32, bf16
// or fp16 (the output dtype only where there is an output).
void validate_slice_fields(const char* family, std::size_t index, std::int64_t numel, bool any_null,
                           const char* const* state_names, std::size_t num_states, DType grad_dtype,
                           bool has_out, DType out_dtype);

}  // namespace detail

// Checks one slice, host or device, of any optimizer (see detail::validate_slice_fields).
template <typename Slice>
void validate_slice(const Slice& s, std::size_t index) {
  using Traits = SliceTraits<Slice>;
  bool any_null = detail::raw_pointer(s.param) == nullptr || detail::raw_pointer(s.grad) == nullptr;
  for (float* state : detail::raw_states(s)) any_null = any_null || state == nullptr;
  detail::validate_slice_fields(Traits::kFamily, index, s.numel, any_null,
                                Traits::kStateNames.data(), Traits::kStateNames.size(),
                                s.grad_dtype, detail::raw_pointer(s.param_out) != nullptr,
                                s.out_dtype);
}

namespace detail {

// The fields every slice has, from `from` into `to`, each pointer mapped by `pointer`.
template <typename To, typename From, typename Pointer>
void copy_common_fields(To& to, const From& from, const Pointer& pointer) {
  to.param = pointer(from.param);
  to.grad = pointer(from.grad);
  to.param_out = pointer(from.param_out);
  to.numel = from.numel;
  to.grad_dtype = from.grad_dtype;
  to.out_dtype = from.out_dtype;
  to.weight_decay = from.weight_decay;
}

}  // namespace detail

// An optimizer's slice from the engine's generic OptimizerSlice / OptimizerDeviceSlice, whose
// state[k] is the optimizer's k-th state.
template <typename Slice, typename Generic>
Slice slice_from_generic(const Generic& generic) {
  Slice slice{};
  detail::copy_common_fields(slice, generic, [](auto p) { return p; });
  constexpr auto& members = SliceTraits<Slice>::kStates;
  for (std::size_t k = 0; k < members.size(); ++k) slice.*members[k] = generic.state[k];
  return slice;
}

// The same for a vector of them.
template <typename Slice, typename Generic>
std::vector<Slice> slices_from_generic(const std::vector<Generic>& generic) {
  std::vector<Slice> slices(generic.size());
  for (std::size_t k = 0; k < generic.size(); ++k)
    slices[k] = slice_from_generic<Slice>(generic[k]);
  return slices;
}

// The host slice over a device slice's memory (the CPU backend, where device memory is host
// memory).
template <typename HostSlice, typename DeviceSlice>
HostSlice host_slice(const DeviceSlice& device) {
  HostSlice host{};
  detail::copy_common_fields(host, device, [](auto p) { return detail::raw_pointer(p); });
  constexpr auto& members = SliceTraits<HostSlice>::kStates;
  const auto states = detail::raw_states(device);
  for (std::size_t k = 0; k < members.size(); ++k) host.*members[k] = states[k];
  return host;
}

}  // namespace zrt
