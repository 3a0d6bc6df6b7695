#pragma once
// Tensors from Python frameworks as flashattn::TensorView, without copies.
//
// Any object that exports DLPack (__dlpack__: PyTorch, JAX, CuPy, ...) or the buffer protocol
// (NumPy) is accepted. torch.Tensor takes a fast path that reads data_ptr(), shape, stride(),
// dtype and device directly: torch's __dlpack__ is a Python method costing a few microseconds
// per tensor, several times the cost of the whole C++ call.
#include <cstdint>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "flashattn/tensor.hpp"

namespace flashattn::python {

namespace nb = nanobind;

// The dtypes an argument accepts, as error messages name them.
inline constexpr const char* kValueDTypes = "f32, f16 or bf16";
inline constexpr const char* kLseDType = "f32";
inline constexpr const char* kRngStateDType = "i64";
inline constexpr const char* kOffsetsDType = "i32";

// Builds views of Python tensors and keeps what DLPack handed over alive until it is destroyed:
// construct one per call, and let it outlive the library call that uses its views.
class TensorViews {
 public:
  // A view of `tensor` read by the library; None gives an absent view.
  TensorView input(nb::handle tensor, const char* name, const char* dtypes);
  // A view of `tensor` written by the library (must be writable); None gives an absent view.
  TensorView output(nb::handle tensor, const char* name, const char* dtypes);

 private:
  TensorView view(nb::handle tensor, const char* name, const char* dtypes, bool writable);

  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
};

// The CUDA stream a call on `tensor` (already viewed as `view`) runs on when the caller names
// none: the framework's current stream for torch and CuPy tensors, else the default stream (0).
std::uintptr_t current_stream(nb::handle tensor, const TensorView& view);

}  // namespace flashattn::python
