#include "python_tensors.hpp"

#include <string>

#include "flashattn/error.hpp"

namespace flashattn::python {
namespace {

[[noreturn]] void fail(ErrorKind kind, const std::string& argument, const std::string& expected,
                       const std::string& given) {
  throw Error(kind, argument, expected, given);
}

// A new reference from the C API as an object; a Python error becomes a C++ exception.
nb::object checked(PyObject* result) {
  if (!result) throw nb::python_error();
  return nb::steal(result);
}

PyObject* interned(const char* text) { return PyUnicode_InternFromString(text); }

std::string str(nb::handle object) { return nb::str(object).c_str(); }

// ---- torch.Tensor ---------------------------------------------------------------------------

// torch's objects the fast path compares with. flashattn never imports torch itself: they are
// looked up once the caller has imported it, and kept for the life of the process.
struct Torch {
  PyObject* tensor_type = nullptr;
  PyObject* strided = nullptr;
  PyObject* float32 = nullptr;
  PyObject* float16 = nullptr;
  PyObject* bfloat16 = nullptr;
  PyObject* int32 = nullptr;
  PyObject* int64 = nullptr;
  PyObject* float8_e4m3fn = nullptr;
  PyObject* float8_e5m2 = nullptr;
  PyObject* current_raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream; null without CUDA
};

// Attribute names, interned once.
struct Names {
  PyObject* dtype = interned("dtype");
  PyObject* layout = interned("layout");
  PyObject* is_cuda = interned("is_cuda");
  PyObject* is_cpu = interned("is_cpu");
  PyObject* device = interned("device");
  PyObject* get_device = interned("get_device");
  PyObject* data_ptr = interned("data_ptr");
  PyObject* shape = interned("shape");
  PyObject* stride = interned("stride");
};

const Names& names() {
  static const Names n;
  return n;
}

// A strong reference to module.attribute (or null, with no error set).
PyObject* attribute(PyObject* module, const char* name) {
  PyObject* value = PyObject_GetAttrString(module, name);
  if (!value) PyErr_Clear();
  return value;
}

const Torch* torch_if_imported() {
  static Torch torch;
  static bool ready = false;
  if (ready) return &torch;
  static PyObject* const module_name = interned("torch");
  PyObject* module = PyImport_GetModule(module_name);
  if (!module) {
    PyErr_Clear();
    return nullptr;
  }
  Torch t;
  t.tensor_type = attribute(module, "Tensor");
  t.strided = attribute(module, "strided");
  t.float32 = attribute(module, "float32");
  t.float16 = attribute(module, "float16");
  t.bfloat16 = attribute(module, "bfloat16");
  t.int32 = attribute(module, "int32");
  t.int64 = attribute(module, "int64");
  t.float8_e4m3fn = attribute(module, "float8_e4m3fn");
  t.float8_e5m2 = attribute(module, "float8_e5m2");
  if (PyObject* c = attribute(module, "_C")) {
    t.current_raw_stream = attribute(c, "_cuda_getCurrentRawStream");
    Py_DECREF(c);
  }
  Py_DECREF(module);
  if (!t.tensor_type || !PyType_Check(t.tensor_type) || !t.strided || !t.float32) return nullptr;  // torch still importing
  torch = t;
  ready = true;
  return &torch;
}

bool is_torch_tensor(const Torch* torch, nb::handle object) {
  return torch && PyObject_TypeCheck(object.ptr(), reinterpret_cast<PyTypeObject*>(torch->tensor_type));
}

DType torch_dtype(const Torch& torch, nb::handle dtype, const std::string& name, const char* dtypes) {
  const PyObject* d = dtype.ptr();
  if (d == torch.float32) return DType::f32;
  if (d == torch.float16) return DType::f16;
  if (d == torch.bfloat16) return DType::bf16;
  if (d == torch.int32) return DType::i32;
  if (d == torch.int64) return DType::i64;
  if (d && d == torch.float8_e4m3fn) return DType::e4m3;
  if (d && d == torch.float8_e5m2) return DType::e5m2;
  fail(ErrorKind::invalid_type, name + ".dtype", dtypes, str(dtype));
}

// Copies a shape or stride tuple into `out`.
void read_ints(nb::handle tuple, std::array<std::int64_t, TensorView::kMaxRank>& out, int rank) {
  for (int i = 0; i < rank; ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple.ptr(), i));
    if (out[i] == -1 && PyErr_Occurred()) throw nb::python_error();
  }
}

void check_rank(int rank, const std::string& name) {
  if (rank < 1 || rank > TensorView::kMaxRank)
    fail(ErrorKind::invalid_argument, name, "1 to " + std::to_string(TensorView::kMaxRank) + " dimensions",
         std::to_string(rank));
}

// A tensor with no elements has no meaningful strides (NumPy's DLPack export gives zeros, which
// validation would reject): any row-major ones describe it as well.
void normalize_empty(TensorView& v) {
  if (v.numel() != 0) return;
  std::int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.stride[i] = stride;
    stride *= v.shape[i] > 0 ? v.shape[i] : 1;
  }
}

TensorView torch_view(const Torch& torch, nb::handle t, const std::string& name, const char* dtypes) {
  const Names& n = names();
  TensorView v;
  v.dtype = torch_dtype(torch, checked(PyObject_GetAttr(t.ptr(), n.dtype)), name, dtypes);
  nb::object layout = checked(PyObject_GetAttr(t.ptr(), n.layout));
  if (layout.ptr() != torch.strided)
    fail(ErrorKind::invalid_type, name + ".layout", "torch.strided (a dense tensor)", str(layout));
  if (checked(PyObject_GetAttr(t.ptr(), n.is_cuda)).ptr() == Py_True) {
    v.device = DeviceKind::cuda;
    v.device_index = int(PyLong_AsLong(checked(PyObject_CallMethodNoArgs(t.ptr(), n.get_device)).ptr()));
  } else if (checked(PyObject_GetAttr(t.ptr(), n.is_cpu)).ptr() == Py_True) {
    v.device = DeviceKind::cpu;
  } else {
    fail(ErrorKind::invalid_type, name + ".device", "cpu or cuda",
         str(checked(PyObject_GetAttr(t.ptr(), n.device))));
  }
  nb::object shape = checked(PyObject_GetAttr(t.ptr(), n.shape));
  nb::object stride = checked(PyObject_CallMethodNoArgs(t.ptr(), n.stride));
  if (!PyTuple_Check(shape.ptr()) || !PyTuple_Check(stride.ptr()))
    fail(ErrorKind::invalid_type, name, "a tensor with integer shape and strides", str(shape));
  v.rank = int(PyTuple_GET_SIZE(shape.ptr()));
  check_rank(v.rank, name);
  read_ints(shape, v.shape, v.rank);
  read_ints(stride, v.stride, v.rank);
  v.data = PyLong_AsVoidPtr(checked(PyObject_CallMethodNoArgs(t.ptr(), n.data_ptr)).ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  normalize_empty(v);
  return v;
}

// ---- DLPack and the buffer protocol ----------------------------------------------------------

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  static const char* const codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string name = dt.code < 7 ? codes[dt.code] : "dlpack code " + std::to_string(dt.code) + " ";
  name += std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

DType dlpack_dtype(nb::dlpack::dtype dt, const std::string& name, const char* dtypes) {
  // Codes from the DLPack header; the float8 ones by value, as older nanobind lacks their names.
  constexpr std::uint8_t kInt = 0, kFloat = 2, kBfloat = 4, kFloat8E4M3FN = 10, kFloat8E5M2 = 12;
  if (dt.lanes == 1) {
    if (dt.code == kFloat && dt.bits == 32) return DType::f32;
    if (dt.code == kFloat && dt.bits == 16) return DType::f16;
    if (dt.code == kBfloat && dt.bits == 16) return DType::bf16;
    if (dt.code == kInt && dt.bits == 32) return DType::i32;
    if (dt.code == kInt && dt.bits == 64) return DType::i64;
    if (dt.code == kFloat8E4M3FN && dt.bits == 8) return DType::e4m3;
    if (dt.code == kFloat8E5M2 && dt.bits == 8) return DType::e5m2;
  }
  fail(ErrorKind::invalid_type, name + ".dtype", dtypes, dlpack_dtype_name(dt));
}

DeviceKind dlpack_device(int device_type, const std::string& name) {
  constexpr int kCPU = 1, kCUDA = 2, kCUDAHost = 3, kCUDAManaged = 13;
  if (device_type == kCPU || device_type == kCUDAHost) return DeviceKind::cpu;
  if (device_type == kCUDA || device_type == kCUDAManaged) return DeviceKind::cuda;
  fail(ErrorKind::invalid_type, name + ".device", "cpu or cuda", "DLPack device type " + std::to_string(device_type));
}

template <class Array>
TensorView dlpack_view(const Array& a, const std::string& name, const char* dtypes) {
  TensorView v;
  v.rank = int(a.ndim());
  check_rank(v.rank, name);
  v.dtype = dlpack_dtype(a.dtype(), name, dtypes);
  v.device = dlpack_device(a.device_type(), name);
  v.device_index = v.device == DeviceKind::cuda ? a.device_id() : 0;
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = std::int64_t(a.shape(i));
    v.stride[i] = a.stride(i);  // DLPack strides count elements, as TensorView's do
  }
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  normalize_empty(v);
  return v;
}

}  // namespace

TensorView TensorViews::input(nb::handle tensor, const char* name, const char* dtypes) {
  return view(tensor, name, dtypes, false);
}

TensorView TensorViews::output(nb::handle tensor, const char* name, const char* dtypes) {
  return view(tensor, name, dtypes, true);
}

TensorView TensorViews::view(nb::handle tensor, const char* name, const char* dtypes, bool writable) {
  if (tensor.is_none()) return {};
  if (const Torch* torch = torch_if_imported(); is_torch_tensor(torch, tensor))
    return torch_view(*torch, tensor, name, dtypes);
  const std::string type_name = Py_TYPE(tensor.ptr())->tp_name;
  if (writable) {
    nb::ndarray<> array;
    if (!nb::try_cast(tensor, array, false))
      fail(ErrorKind::invalid_type, name, "a writable tensor (DLPack or buffer protocol)",
           type_name);
    outputs_.push_back(array);
    return dlpack_view(array, name, dtypes);
  }
  nb::ndarray<nb::ro> array;
  if (!nb::try_cast(tensor, array, false))
    fail(ErrorKind::invalid_type, name, "a tensor (DLPack or buffer protocol)", type_name);
  inputs_.push_back(array);
  return dlpack_view(array, name, dtypes);
}

std::uintptr_t current_stream(nb::handle tensor, const TensorView& view) {
  if (view.device != DeviceKind::cuda) return 0;
  if (const Torch* torch = torch_if_imported(); is_torch_tensor(torch, tensor) && torch->current_raw_stream) {
    nb::object index = checked(PyLong_FromLong(view.device_index));
    nb::object stream = checked(PyObject_CallOneArg(torch->current_raw_stream, index.ptr()));
    return std::uintptr_t(PyLong_AsVoidPtr(stream.ptr()));
  }
  static PyObject* const cupy_name = interned("cupy");
  if (PyObject* cupy = PyImport_GetModule(cupy_name)) {
    nb::object module = nb::steal(cupy);
    nb::object array_type = module.attr("ndarray");
    if (PyObject_IsInstance(tensor.ptr(), array_type.ptr()) == 1)
      return nb::cast<std::uintptr_t>(module.attr("cuda").attr("get_current_stream")(view.device_index).attr("ptr"));
  }
  PyErr_Clear();
  return 0;  // the default stream
}

}  // namespace flashattn::python
