// flashattn._C: the C++ library's entry points over Python tensors. Outputs are provided by the
// caller and written in place; the GIL is released while the library runs.
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference.hpp"
#include "python_tensors.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace flashattn::python {
namespace {

// The options both directions take, as Python passes them.
struct Options {
  std::optional<float> softmax_scale;
  bool causal = false;
  std::pair<int, int> window_size{-1, -1};
  float softcap = 0.0f;
  nb::handle cu_seqlens_q, cu_seqlens_k;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  std::optional<std::uintptr_t> stream;
  nb::handle alibi_slopes;
};

// Fills the library's options; `q`/`view_q` pick the stream when the caller names none.
void apply(const Options& o, TensorViews& views, nb::handle q, const TensorView& view_q, AttentionOptions& a) {
  a.softmax_scale = o.softmax_scale;
  a.causal = o.causal;
  a.window_left = o.window_size.first;
  a.window_right = o.window_size.second;
  a.softcap = o.softcap;
  a.cu_seqlens_q = views.input(o.cu_seqlens_q, "cu_seqlens_q", kOffsetsDType);
  a.cu_seqlens_k = views.input(o.cu_seqlens_k, "cu_seqlens_k", kOffsetsDType);
  a.max_seqlen_q = o.max_seqlen_q;
  a.max_seqlen_k = o.max_seqlen_k;
  a.alibi_slopes = views.input(o.alibi_slopes, "alibi_slopes", kLseDType);  // float32
  a.stream = reinterpret_cast<void*>(o.stream ? *o.stream : current_stream(q, view_q));
}

// Runs `call(args)` with the GIL released.
template <class Args>
void run(void (*call)(const Args&), const Args& args) {
  nb::gil_scoped_release released;
  call(args);
}

struct Forward {
  TensorViews views;
  ForwardArgs args;

  Forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, const Options& o) {
    args.q = views.input(q, "q", kValueDTypes);
    args.k = views.input(k, "k", kValueDTypes);
    args.v = views.input(v, "v", kValueDTypes);
    args.out = views.output(out, "out", kValueDTypes);
    args.lse = views.output(lse, "lse", kLseDType);
    apply(o, views, q, args.q, args);
  }
};

struct Backward {
  TensorViews views;
  BackwardArgs args;

  Backward(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
           nb::handle dq, nb::handle dk, nb::handle dv, bool deterministic, const Options& o) {
    args.dout = views.input(dout, "dout", kValueDTypes);
    args.q = views.input(q, "q", kValueDTypes);
    args.k = views.input(k, "k", kValueDTypes);
    args.v = views.input(v, "v", kValueDTypes);
    args.out = views.input(out, "out", kValueDTypes);
    args.lse = views.input(lse, "lse", kLseDType);
    args.dq = views.output(dq, "dq", kValueDTypes);
    args.dk = views.output(dk, "dk", kValueDTypes);
    args.dv = views.output(dv, "dv", kValueDTypes);
    args.deterministic = deterministic;
    apply(o, views, q, args.q, args);
  }
};

PyObject* python_exception(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_argument: return PyExc_ValueError;
    case ErrorKind::invalid_type: return PyExc_TypeError;
    case ErrorKind::unsupported: return PyExc_NotImplementedError;
    case ErrorKind::runtime: return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

// ---- docstrings --------------------------------------------------------------------------------

constexpr const char* kForwardDoc = R"(Attention forward, written into caller-provided `out` (and `lse`).

q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim), or packed
(total, heads, head_dim) with cu_seqlens_q/k (int32, batch + 1 offsets) and max_seqlen_q/k.
Any tensor exporting DLPack or the buffer protocol (torch, CuPy, JAX inputs, NumPy), with any
strides whose last dimension is contiguous; nothing is copied. dtypes f16/bf16 (f32 on the CPU).
out: like q. lse: float32 (batch, heads_q, seqlen_q), or (heads_q, total_q) packed; optional.
On the GPU every outer stride must be a multiple of 16 bytes: pad lse rows to 4 floats.
window_size: (left, right), -1 (or a size >= seqlen_k) unbounded; causal sets right = 0.
softcap: 0 = off. alibi_slopes: float32 (heads_q,) or (batch, heads_q): ALiBi, the score of query
i and key j gains -slope * |i + seqlen_k - seqlen_q - j| (after softcap); no gradient.
stream: a cudaStream_t as an int; by default the current stream of torch or CuPy, else stream 0.
Raises ValueError / TypeError for bad arguments (nothing written), NotImplementedError for what
this build does not support.)";

constexpr const char* kBackwardDoc = R"(Attention backward, written into caller-provided dq, dk, dv.

Takes the forward's inputs, its `out` and `lse`, and `dout` (the gradient of the loss with
respect to out), with the same layouts and options as forward(); deterministic asks for the
same bits on every run.)";

}  // namespace
}  // namespace flashattn::python

NB_MODULE(_C, m) {
  using namespace flashattn;
  using namespace flashattn::python;

  m.doc() = "flashattn's C++ library over DLPack tensors (use the package `flashattn`).";
  m.attr("__version__") = flashattn::version();

  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      PyErr_SetString(python_exception(e.kind()), e.what());
    }
  });

  // Every entry point takes the tensors positionally and the options by keyword.
#define FA_OPTION_ARGS                                                                          \
  "softmax_scale"_a = nb::none(), "causal"_a = false, "window_size"_a = std::make_pair(-1, -1), \
  "softcap"_a = 0.0f, "cu_seqlens_q"_a = nb::none(), "cu_seqlens_k"_a = nb::none(),             \
  "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "stream"_a = nb::none(), "alibi_slopes"_a = nb::none()
#define FA_OPTION_PARAMS                                                                          \
  std::optional<float> softmax_scale, bool causal, std::pair<int, int> window_size, float softcap, \
      nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,        \
      std::optional<std::uintptr_t> stream, nb::handle alibi_slopes
#define FA_OPTIONS                                                                                      \
  Options {                                                                                             \
    softmax_scale, causal, window_size, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, \
        stream, alibi_slopes                                                                            \
  }

  m.def(
      "forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, FA_OPTION_PARAMS) {
        Forward f(q, k, v, out, lse, FA_OPTIONS);
        run(&flashattn::forward, f.args);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = nb::none(), nb::kw_only(), FA_OPTION_ARGS, kForwardDoc);

  m.def(
      "backward",
      [](nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
         nb::handle dq, nb::handle dk, nb::handle dv, bool deterministic, FA_OPTION_PARAMS) {
        Backward b(dout, q, k, v, out, lse, dq, dk, dv, deterministic, FA_OPTIONS);
        run(&flashattn::backward, b.args);
      },
      "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, nb::kw_only(),
      "deterministic"_a = false, FA_OPTION_ARGS, kBackwardDoc);

  m.def(
      "reference_forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, FA_OPTION_PARAMS) {
        Forward f(q, k, v, out, lse, FA_OPTIONS);
        run(&flashattn::reference::forward, f.args);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = nb::none(), nb::kw_only(), FA_OPTION_ARGS,
      "forward() computed by the float64 reference in plain loops (CPU tensors; slow, for checking).");

  m.def(
      "reference_backward",
      [](nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
         nb::handle dq, nb::handle dk, nb::handle dv, bool deterministic, FA_OPTION_PARAMS) {
        Backward b(dout, q, k, v, out, lse, dq, dk, dv, deterministic, FA_OPTIONS);
        run(&flashattn::reference::backward, b.args);
      },
      "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, nb::kw_only(),
      "deterministic"_a = false, FA_OPTION_ARGS,
      "backward() computed by the float64 reference in plain loops (CPU tensors; slow, for checking).");

  // For measuring the binding's overhead: the seconds one forward() call takes when the same
  // arguments are passed from C++ in a loop of `iterations` (no Python in between).
  m.def(
      "_seconds_per_direct_forward",
      [](int iterations, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
         FA_OPTION_PARAMS) {
        Forward f(q, k, v, out, lse, FA_OPTIONS);
        nb::gil_scoped_release released;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) flashattn::forward(f.args);
        const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
        return elapsed.count() / (iterations > 0 ? iterations : 1);
      },
      "iterations"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = nb::none(), nb::kw_only(), FA_OPTION_ARGS);

#undef FA_OPTIONS
#undef FA_OPTION_PARAMS
#undef FA_OPTION_ARGS

  m.def("built_with_cuda", &flashattn::built_with_cuda, "Whether this build contains the CUDA backend.");
  m.def("cuda_available", &flashattn::cuda_available,
        "Whether the CUDA backend is built and a CUDA device is usable now.");
}
