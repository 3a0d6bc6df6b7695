#pragma once
// Head dims below a kernel's width. The GPU kernels are instantiated for a few head dims (the
// widths: 32, 64, 96, 128, 192, 256); a problem of head dim d runs the smallest built width >= d
// with its tiles' columns >= d zero-filled on load and never stored, so Q K^T, P V and every
// gradient are those of d columns. No operand is copied into a padded buffer.
//
// How a 16-byte piece of a row (8 elements) moves is decided per problem on the host:
//   - `vectors`: d % 8 == 0 and every operand's pointer and outer strides are multiples of
//     16 bytes. A piece is then either wholly inside the row or wholly past it: the ordinary
//     16-byte copy with one more predicate (column < d).
//   - otherwise (d = 59, 111, ..., or strides that are not 16-byte multiples): rows are only
//     element-aligned; a piece is read and written one element at a time through registers
//     (synchronous loads, then one 16-byte shared-memory store).
// Kernels take the mode as a template parameter (ColumnMode below): `full` at d == width with
// vector-aligned operands (the code that existed before, unchanged: no predicate), `vectors` and
// `elements` otherwise. So the predicates cost nothing where d is a width, and the element path
// (whose loads go through registers) burdens only the problems that need it.
#include <cstdint>

#include "common/problem.hpp"
#ifdef __CUDACC__
#include "cuda/common/device_math.cuh"
#endif

namespace flashattn::cuda {

// The columns of a problem as the kernels see them.
struct HeadColumns {
  int dim;       // the problem's head dim (<= the kernel's width)
  bool vectors;  // 16-byte pieces can be moved whole (see above)
};

// Host: whether operand t, over `rows` rows, `heads` heads and `batch` sequences, allows
// 16-byte moves: pointer and every stride that is followed a multiple of 16 bytes.
inline bool vector_aligned(const detail::SeqTensor& t, int element_bytes, long long rows, int heads, int batch) {
  auto ok = [&](std::int64_t stride, long long extent) {
    return extent <= 1 || (stride * element_bytes) % 16 == 0;
  };
  return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 && ok(t.seq_stride, rows) &&
         ok(t.head_stride, heads) && ok(t.batch_stride, batch);
}

// Host: vector_aligned for an operand over the problem's query rows (Q, O, dO, dQ) or key rows.
inline bool vector_aligned(const detail::Problem& p, const detail::SeqTensor& t, bool query_side) {
  const int bytes = p.dtype == DType::f32 ? 4 : 2;
  const long long rows = query_side ? (p.is_varlen() ? p.total_q : p.seqlen_q) : (p.is_varlen() ? p.total_k : p.seqlen_k);
  return vector_aligned(t, bytes, rows, query_side ? p.heads_q : p.heads_kv, p.is_varlen() ? 1 : p.batch);
}

inline HeadColumns head_columns(const detail::ForwardProblem& p) {
  const bool aligned = vector_aligned(p, p.q, true) && vector_aligned(p, p.k, false) &&
                       vector_aligned(p, p.v, false) && vector_aligned(p, p.out, true);
  return {p.head_dim, p.head_dim % 8 == 0 && aligned};
}

inline HeadColumns head_columns(const detail::BackwardProblem& p) {
  const bool aligned = vector_aligned(p, p.q, true) && vector_aligned(p, p.k, false) &&
                       vector_aligned(p, p.v, false) && vector_aligned(p, p.out, true) &&
                       vector_aligned(p, p.dout, true) && vector_aligned(p, p.dq, true) &&
                       vector_aligned(p, p.dk, false) && vector_aligned(p, p.dv, false);
  return {p.head_dim, p.head_dim % 8 == 0 && aligned};
}

// How a kernel moves the columns of its tiles (see above). `any` chooses between `vectors` and
// `elements` at run time by HeadColumns::vectors (one uniform branch per piece), for the
// memory-bound passes where a template parameter would only add instances.
enum class ColumnMode { full, vectors, elements, any };

// Host: the mode a kernel of width `width` runs these columns in.
inline ColumnMode column_mode(const HeadColumns& c, int width) {
  if (!c.vectors) return ColumnMode::elements;
  return c.dim == width ? ColumnMode::full : ColumnMode::vectors;
}

#ifdef __CUDACC__
// One 16-byte piece (8 16-bit elements, starting at column `col`) of a row, global -> shared.
// full: cp.async, zero-filled unless `row_valid`. vectors: columns >= c.dim are zero-filled too.
// elements: read element by element (synchronously), columns >= c.dim as zeros.
template <ColumnMode kMode, class Element>
CUTE_DEVICE void load_piece(Element* smem, const Element* gmem, bool row_valid, int col, const HeadColumns& c) {
  static_assert(sizeof(Element) == 2);
  if constexpr (kMode == ColumnMode::full) {
    cp_async_16(smem, gmem, row_valid);
  } else if constexpr (kMode == ColumnMode::vectors) {
    cp_async_16(smem, gmem, row_valid && col < c.dim);
  } else if constexpr (kMode == ColumnMode::elements) {
    const auto* src = reinterpret_cast<const std::uint16_t*>(gmem);
    std::uint32_t packed[4];
    CUTE_UNROLL
    for (int e = 0; e < 8; e += 2) {
      const std::uint32_t lo = row_valid && col + e < c.dim ? src[e] : 0u;
      const std::uint32_t hi = row_valid && col + e + 1 < c.dim ? src[e + 1] : 0u;
      packed[e / 2] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(smem) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  } else {
    if (c.vectors)
      load_piece<ColumnMode::vectors>(smem, gmem, row_valid, col, c);
    else
      load_piece<ColumnMode::elements>(smem, gmem, row_valid, col, c);
  }
}

// One 16-byte piece, value `v`, to global memory at column `col`: only columns < c.dim.
template <ColumnMode kMode, class Element>
CUTE_DEVICE void store_piece(Element* gmem, const uint4& v, int col, const HeadColumns& c) {
  static_assert(sizeof(Element) == 2);
  if constexpr (kMode == ColumnMode::full) {
    *reinterpret_cast<uint4*>(gmem) = v;
  } else if constexpr (kMode == ColumnMode::vectors) {
    if (col < c.dim) *reinterpret_cast<uint4*>(gmem) = v;
  } else if constexpr (kMode == ColumnMode::elements) {
    const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
    auto* dst = reinterpret_cast<std::uint16_t*>(gmem);
    CUTE_UNROLL
    for (int e = 0; e < 8; ++e)
      if (col + e < c.dim) dst[e] = std::uint16_t(words[e / 2] >> (16 * (e % 2)));
  } else {
    if (c.vectors)
      store_piece<ColumnMode::vectors>(gmem, v, col, c);
    else
      store_piece<ColumnMode::elements>(gmem, v, col, c);
  }
}

// Two adjacent elements (a, b) at columns col, col + 1 (col even): only columns < c.dim.
template <ColumnMode kMode, class T>
CUTE_DEVICE void store_pair(T* gmem, T a, T b, int col, const HeadColumns& c) {
  struct alignas(2 * sizeof(T)) Pair {
    T first, second;
  };
  if constexpr (kMode == ColumnMode::full) {
    *reinterpret_cast<Pair*>(gmem) = Pair{a, b};
  } else if constexpr (kMode == ColumnMode::vectors) {
    if (col < c.dim) *reinterpret_cast<Pair*>(gmem) = Pair{a, b};
  } else if constexpr (kMode == ColumnMode::elements) {
    if (col < c.dim) gmem[0] = a;
    if (col + 1 < c.dim) gmem[1] = b;
  } else {
    if (c.vectors)
      store_pair<ColumnMode::vectors>(gmem, a, b, col, c);
    else
      store_pair<ColumnMode::elements>(gmem, a, b, col, c);
  }
}
#endif

}  // namespace flashattn::cuda
