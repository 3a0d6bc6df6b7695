#pragma once
// Views and conversions of mma.sync register fragments (the SM80 m16n8k16 family), for kernels
// that keep scores and outputs in registers between two GEMMs.
//
// An m16n8 accumulator tile gives each thread 4 floats: columns 2*(lane%4) + {0,1} of rows
// lane/4 and lane/4 + 8. CuTe lays one thread's accumulator out as (MMA=(2,2), MMA_M, MMA_N),
// the first mode being (column pair, row half).
#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace flashattn::cuda {

// (MMA=(2,2), MMA_M, MMA_N) -> (rows=(2, MMA_M), cols=(2, MMA_N)): index a thread's accumulator
// by (row, column), e.g. for row-wise softmax.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto accumulator_rowcol_layout(Layout layout) {
  using namespace cute;
  static_assert(decltype(size<0>(layout))::value == 4, "an m16n8 accumulator fragment");
  static_assert(decltype(rank(layout))::value == 3);
  auto split = logical_divide(layout, Shape<_2>{});  // ((2,2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(split), get<1>(split)),
                     make_layout(get<0, 0>(split), get<2>(split)));
}

template <class Tensor>
CUTE_HOST_DEVICE constexpr auto rowcol_view(Tensor&& t) {
  return cute::make_tensor(t.data(), accumulator_rowcol_layout(t.layout()));
}

// (4, MMA_M, MMA_N) accumulator -> ((4,2), MMA_M, MMA_N/2): the A operand of an m16n8k16 mma,
// whose per-thread registers cover two adjacent n8 accumulator tiles (P in P.V).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto accumulator_as_a_operand_layout(Layout layout) {
  using namespace cute;
  static_assert(decltype(size<0>(layout))::value == 4, "an m16n8 accumulator fragment");
  static_assert(decltype(size<2>(layout))::value % 2 == 0, "an even number of n8 tiles");
  auto split = logical_divide(layout, Shape<Underscore, Underscore, _2>{});  // (4, M, (2, N/2))
  return make_layout(make_layout(get<0>(split), get<2, 0>(split)), get<1>(split),
                     get<2, 1>(split));
}

// An owning register copy of `t` converted to `To`, with the same (static) layout.
template <class To, class Tensor>
CUTE_DEVICE auto convert_fragment(Tensor const& t) {
  using From = typename cute::remove_cvref_t<Tensor>::value_type;
  constexpr int kSize = decltype(cute::size(t))::value;
  auto out = cute::make_tensor<To>(t.layout());
  cutlass::NumericArrayConverter<To, From, kSize> convert;
  *reinterpret_cast<cutlass::Array<To, kSize>*>(out.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kSize> const*>(t.data()));
  return out;
}

// Reduces across the `kWidth` consecutive lanes that share a row (kWidth = 4 for m16n8 tiles).
template <int kWidth, class Op>
CUTE_DEVICE float lane_group_allreduce(float x, Op op) {
  static_assert(kWidth > 0 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0);
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2)
    x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

struct MaxOp {
  CUTE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  CUTE_DEVICE float operator()(float a, float b) const { return a + b; }
};

}  // namespace flashattn::cuda
