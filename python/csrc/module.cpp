// flashattn._C: the C++ library's entry points over Python tensors. Outputs are provided by the
// caller and written in place; the GIL is released while the library runs.
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference.hpp"
#include "distributed.hpp"
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
  float dropout_p = 0.0f;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  nb::handle dropout_state;
  std::optional<std::uintptr_t> stream;
  nb::handle alibi_slopes;
  int sm_margin;
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
  a.dropout_p = o.dropout_p;
  a.dropout_seed = o.dropout_seed;
  a.dropout_offset = o.dropout_offset;
  a.dropout_state = views.input(o.dropout_state, "dropout_state", kRngStateDType);
  a.alibi_slopes = views.input(o.alibi_slopes, "alibi_slopes", kLseDType);  // float32
  a.stream = reinterpret_cast<void*>(o.stream ? *o.stream : current_stream(q, view_q));
  a.sm_margin = o.sm_margin;
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

struct KvCache {
  TensorViews views;
  KvCacheArgs args;
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
head_dim: 1 to 256 on the GPU (every head dim, on the next wider kernel), up to 1024 on the CPU.
window_size: (left, right), -1 (or a size >= seqlen_k) unbounded; causal sets right = 0.
softcap: 0 = off. alibi_slopes: float32 (heads_q,) or (batch, heads_q): ALiBi, the score of query
i and key j gains -slope * |i + seqlen_k - seqlen_q - j| (after softcap); no gradient.
sm_margin: CUDA, SMs that the persistent (Hopper) kernels leave free for kernels running beside
them on other streams (a communication library's); 0 = none.
FP8: q, k, v float8_e4m3fn (CUDA, Hopper; no dropout, ALiBi or pages), out f16 or bf16;
q_descale, k_descale, v_descale: float32 (batch, heads_kv) or (1,) (q and k also (batch, heads_kv,
ceil(seqlen / 128)): block quantization), each stored value times its
factor being the value it stands for; None = 1.
block_table (batch, max_blocks) int32, packed calls only: k and v are paged, (num_blocks,
page_size, heads_kv, head_dim), page_size a multiple of 16 from 16 to 512. seqused_k (batch,)
int32, packed calls only: sequence b uses its first seqused_k[b] keys (ALiBi's seqlen_k then).
dropout_p: drop each attention probability with this probability (kept ones scaled by
1 / (1 - dropout_p)); which ones is a function of (dropout_seed, dropout_offset), or of the int64
tensor dropout_state = (seed, offset) in q's memory, read when the call runs. The backward must
get the forward's values.
stream: a cudaStream_t as an int; by default the current stream of torch or CuPy, else stream 0.
Raises ValueError / TypeError for bad arguments (nothing written), NotImplementedError for what
this build does not support.)";

constexpr const char* kForwardKvcacheDoc = R"(Attention over a KV cache, written into `out` (and `lse`).

q: (batch, seqlen_q, heads_q, head_dim). k_cache, v_cache: (batch_cache, seqlen_cache, heads_kv,
head_dim), or paged (num_blocks, page_size, heads_kv, head_dim) with block_table (batch,
max_blocks) int32; page_size a multiple of 16 from 16 to 512. cache_seqlens (batch,) int32: rows
in each cache before the call (None: the whole cache). k, v (batch, seqlen_new, heads_kv,
head_dim): written into the caches in place at rows cache_seqlens[b] + i. rotary_cos/rotary_sin
(seqlen_ro, rotary_dim / 2), q's dtype: rotate the new keys (at their rows) and the queries (at
cache_seqlens[b] + i when causal or local, at cache_seqlens[b] otherwise); rotary_interleaved
pairs (2j, 2j+1) instead of (j, j + rotary_dim/2). cache_batch_idx (batch,) int32: the cache
batch of each sequence (contiguous caches). cache_leftpad (batch,) int32: the first cache row of
each sequence. The queries attend to rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new),
masks aligned to the bottom-right. alibi_slopes: float32 (heads_q,) or (batch, heads_q): ALiBi,
the score of query i and cache row j gains -slope * |i + seqlen_k - seqlen_q - j|, seqlen_k =
cache_seqlens[b] + seqlen_new (cache_leftpad does not move it). num_splits: split-KV count on the
GPU (0 = heuristic).
lse: float32 (batch, heads_q, seqlen_q), optional. Other options as forward(). Raises as
forward() does; on CPU tensors the index tensors' contents are checked (nothing is written,
the caches included, on error).)";
constexpr const char* kDistForwardDoc = R"(Context-parallel attention forward on this rank's zigzag shards.

Like forward() (same tensors, layouts and options; no window_size), over `comm` (a Communicator:
nccl_communicator() for CUDA tensors, python_communicator() for CPU ones). strategy: 'ring' or
'all_to_all'. Every rank calls it at the same time with the same shapes and options. cu_seqlens_q/k
are the GLOBAL offsets (every document a multiple of 2 * ranks long), max_seqlen_q/k the global
longest document. flashattn.distributed describes the sharding and wraps this for PyTorch.)";

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
  "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "dropout_p"_a = 0.0f, "dropout_seed"_a = 0,          \
  "dropout_offset"_a = 0, "dropout_state"_a = nb::none(), "stream"_a = nb::none(),                 \
  "alibi_slopes"_a = nb::none(), "sm_margin"_a = 0
#define FA_OPTION_PARAMS                                                                          \
  std::optional<float> softmax_scale, bool causal, std::pair<int, int> window_size, float softcap, \
      nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,        \
      float dropout_p, std::uint64_t dropout_seed, std::uint64_t dropout_offset,                   \
      nb::handle dropout_state, std::optional<std::uintptr_t> stream, nb::handle alibi_slopes, int sm_margin
#define FA_OPTIONS                                                                               \
  Options {                                                                                      \
    softmax_scale, causal, window_size, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,       \
        max_seqlen_k, dropout_p, dropout_seed, dropout_offset, dropout_state, stream, alibi_slopes, \
        sm_margin                                                                                \
  }

  m.def(
      "forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, FA_OPTION_PARAMS,
         nb::handle block_table, nb::handle seqused_k, nb::handle q_descale, nb::handle k_descale,
         nb::handle v_descale) {
        Forward f(q, k, v, out, lse, FA_OPTIONS);
        f.args.block_table = f.views.input(block_table, "block_table", kOffsetsDType);
        f.args.seqused_k = f.views.input(seqused_k, "seqused_k", kOffsetsDType);
        f.args.q_descale = f.views.input(q_descale, "q_descale", kLseDType);  // float32
        f.args.k_descale = f.views.input(k_descale, "k_descale", kLseDType);
        f.args.v_descale = f.views.input(v_descale, "v_descale", kLseDType);
        run(&flashattn::forward, f.args);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = nb::none(), nb::kw_only(), FA_OPTION_ARGS,
      "block_table"_a = nb::none(), "seqused_k"_a = nb::none(), "q_descale"_a = nb::none(),
      "k_descale"_a = nb::none(), "v_descale"_a = nb::none(), kForwardDoc);

  m.def(
      "forward_kvcache",
      [](nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse, nb::handle k,
         nb::handle v, nb::handle rotary_cos, nb::handle rotary_sin, nb::handle cache_seqlens,
         nb::handle cache_batch_idx, nb::handle cache_leftpad, nb::handle block_table, bool rotary_interleaved,
         std::optional<float> softmax_scale, bool causal, std::pair<int, int> window_size, float softcap,
         nb::handle alibi_slopes, int num_splits, std::optional<std::uintptr_t> stream) {
        KvCache c;
        KvCacheArgs& a = c.args;
        a.q = c.views.input(q, "q", kValueDTypes);
        const bool appends = !k.is_none();
        a.k_cache = appends ? c.views.output(k_cache, "k_cache", kValueDTypes)
                            : c.views.input(k_cache, "k_cache", kValueDTypes);
        a.v_cache = appends ? c.views.output(v_cache, "v_cache", kValueDTypes)
                            : c.views.input(v_cache, "v_cache", kValueDTypes);
        a.out = c.views.output(out, "out", kValueDTypes);
        a.lse = c.views.output(lse, "lse", kLseDType);
        a.k_new = c.views.input(k, "k", kValueDTypes);
        a.v_new = c.views.input(v, "v", kValueDTypes);
        a.rotary_cos = c.views.input(rotary_cos, "rotary_cos", kValueDTypes);
        a.rotary_sin = c.views.input(rotary_sin, "rotary_sin", kValueDTypes);
        a.cache_seqlens = c.views.input(cache_seqlens, "cache_seqlens", kOffsetsDType);
        a.cache_batch_idx = c.views.input(cache_batch_idx, "cache_batch_idx", kOffsetsDType);
        a.cache_leftpad = c.views.input(cache_leftpad, "cache_leftpad", kOffsetsDType);
        a.block_table = c.views.input(block_table, "block_table", kOffsetsDType);
        a.rotary_interleaved = rotary_interleaved;
        a.softmax_scale = softmax_scale;
        a.causal = causal;
        a.window_left = window_size.first;
        a.window_right = window_size.second;
        a.softcap = softcap;
        a.alibi_slopes = c.views.input(alibi_slopes, "alibi_slopes", kLseDType);  // float32
        a.num_splits = num_splits;
        a.stream = reinterpret_cast<void*>(stream ? *stream : current_stream(q, a.q));
        run(&flashattn::forward_kvcache, a);
      },
      "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "lse"_a = nb::none(), nb::kw_only(), "k"_a = nb::none(),
      "v"_a = nb::none(), "rotary_cos"_a = nb::none(), "rotary_sin"_a = nb::none(), "cache_seqlens"_a = nb::none(),
      "cache_batch_idx"_a = nb::none(), "cache_leftpad"_a = nb::none(), "block_table"_a = nb::none(),
      "rotary_interleaved"_a = false, "softmax_scale"_a = nb::none(), "causal"_a = false,
      "window_size"_a = std::make_pair(-1, -1), "softcap"_a = 0.0f, "alibi_slopes"_a = nb::none(), "num_splits"_a = 0,
      "stream"_a = nb::none(), kForwardKvcacheDoc);

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

  register_distributed(m);
  m.def(
      "dist_forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, dist::Communicator& comm,
         const std::string& strategy, FA_OPTION_PARAMS) {
        const dist::Strategy s = parse_strategy(strategy);
        Forward f(q, k, v, out, lse, FA_OPTIONS);
        nb::gil_scoped_release released;
        dist::forward(f.args, comm, s);
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "comm"_a, nb::kw_only(), "strategy"_a = "ring", FA_OPTION_ARGS,
      kDistForwardDoc);
  m.def(
      "dist_backward",
      [](nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle dq,
         nb::handle dk, nb::handle dv, dist::Communicator& comm, const std::string& strategy, bool deterministic,
         FA_OPTION_PARAMS) {
        const dist::Strategy s = parse_strategy(strategy);
        Backward b(dout, q, k, v, out, lse, dq, dk, dv, deterministic, FA_OPTIONS);
        nb::gil_scoped_release released;
        dist::backward(b.args, comm, s);
      },
      "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "comm"_a, nb::kw_only(),
      "strategy"_a = "ring", "deterministic"_a = false, FA_OPTION_ARGS,
      "Context-parallel attention backward on this rank's shards (see dist_forward and backward()).");

#undef FA_OPTIONS
#undef FA_OPTION_PARAMS
#undef FA_OPTION_ARGS

  m.def(
      "quantize_e4m3",
      [](nb::handle x, nb::handle out, nb::handle descale, nb::handle signs, int heads_kv, bool per_tensor,
         bool per_block, std::optional<std::uintptr_t> stream) {
        TensorViews views;
        QuantizeArgs a;
        a.x = views.input(x, "x", kValueDTypes);
        a.out = views.output(out, "out", "e4m3");
        a.descale = views.output(descale, "descale", kLseDType);  // float32
        a.signs = views.input(signs, "signs", kLseDType);
        a.heads_kv = heads_kv;
        a.per_tensor = per_tensor;
        a.per_block = per_block;
        a.stream = reinterpret_cast<void*>(stream ? *stream : current_stream(x, a.x));
        run(&flashattn::quantize_e4m3, a);
      },
      "x"_a, "out"_a, "descale"_a, nb::kw_only(), "signs"_a = nb::none(), "heads_kv"_a = 0, "per_tensor"_a = false,
      "per_block"_a = false, "stream"_a = nb::none(),
      "x (batch, seqlen, heads, head_dim) -> out (e4m3, caller-provided) and descale (float32 (batch, heads_kv); "
      "(batch, heads_kv, ceil(seqlen / 128)) with per_block; (1,) with per_tensor): out * descale stands for x, "
      "amax / 448 per slot. signs (float32 (head_dim,) of +-1): first multiply by the random-sign Walsh-Hadamard "
      "transform (flashattn/fp8.hpp).");

  m.def("built_with_cuda", &flashattn::built_with_cuda, "Whether this build contains the CUDA backend.");
  m.def("cuda_available", &flashattn::cuda_available,
        "Whether the CUDA backend is built and a CUDA device is usable now.");
}
