#pragma once
// Views of wgmma register fragments, A operands kept in registers, and the warpgroup GEMM issue,
// for kernels that keep scores, outputs and reused operands in registers between GEMMs.
//
// A 64xN fp32 wgmma accumulator gives each thread ((2, 2, N/8), MMA_M, MMA_N) values: a pair of
// adjacent columns, rows r and r + 8, and N/8 column groups of 8 (r = 16 * warp + lane / 4).
#include <cute/tensor.hpp>

namespace flashattn::cuda::sm90 {

// ((2, 2, N/8), MMA_M, MMA_N) -> (rows = (2, MMA_M), cols = (2, N/8, MMA_N)).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_rowcol_layout(Layout layout) {
  using namespace cute;
  static_assert(decltype(rank<0>(layout))::value == 3, "a wgmma accumulator fragment");
  static_assert(decltype(rank(layout))::value == 3);
  return make_layout(make_layout(get<0, 1>(layout), get<1>(layout)),
                     make_layout(get<0, 0>(layout), get<0, 2>(layout), get<2>(layout)));
}

template <class Tensor>
CUTE_HOST_DEVICE constexpr auto gmma_rowcol(Tensor&& t) {
  return cute::make_tensor(t.data(), gmma_rowcol_layout(t.layout()));
}

// ((2, 2, N/8), MMA_M, MMA_N) -> ((2, 2), MMA_M, (N/8, MMA_N)): the accumulator as m16n8 tiles
// (per tile: column pair, row half), for code written for mma.sync fragments (common/dropout.cuh).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_as_m16n8_layout(Layout layout) {
  using namespace cute;
  static_assert(decltype(rank<0>(layout))::value == 3, "a wgmma accumulator fragment");
  return make_layout(make_layout(get<0, 0>(layout), get<0, 1>(layout)), get<1>(layout),
                     make_layout(get<0, 2>(layout), get<2>(layout)));
}

template <class Tensor>
CUTE_HOST_DEVICE constexpr auto gmma_as_m16n8(Tensor&& t) {
  return cute::make_tensor(t.data(), gmma_as_m16n8_layout(t.layout()));
}

// A 16-bit wgmma A operand in registers holds ((2, 2, 2), MMA_M, MMA_K) per thread for k = 16
// columns: the same (column pair, row half) as an accumulator and two column groups of 8. So
// an accumulator ((2, 2, N/8), MMA_M, 1) read as an A operand is ((2, 2, 2), MMA_M, N/16):
// P = softmax(S) feeds P.V without leaving registers.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_accumulator_as_a_layout(Layout layout) {
  using namespace cute;
  static_assert(decltype(rank<0>(layout))::value == 3, "a wgmma accumulator fragment");
  static_assert(decltype(size<0, 2>(layout))::value % 2 == 0, "an even number of 8-column groups");
  auto groups = logical_divide(get<0, 2>(layout), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(layout), get<0, 1>(layout), get<0, 0>(groups)),
                     get<1>(layout), coalesce(make_layout(get<0, 1>(groups), get<2>(layout))));
}

// The wgmma of K-major A and B (fp32 accumulator) with A from registers (RS) or from shared
// memory (SS); B from shared memory.
template <class Element, class TileShape, bool kARegisters>
auto k_major_op_selector() {
  if constexpr (kARegisters)
    return cute::GMMA::rs_op_selector<Element, Element, float, TileShape>();
  else
    return cute::GMMA::ss_op_selector<Element, Element, float, TileShape>();
}

// Reads an A operand's tile from shared memory into an RS wgmma's register fragment (ldmatrix, as
// CopyAtom says), for an A operand that serves several GEMMs: the forward's Q over a tile's key
// blocks, the d = 64 backward's K_w and V_w over a tile's steps.
template <class CopyAtom, class TiledMma, class SmemTile, class Fragment>
CUTE_DEVICE void load_a_fragment(TiledMma const& mma, int thread, SmemTile const& smem, Fragment& fragment) {
  auto copy_a = cute::make_tiled_copy_A(CopyAtom{}, mma);
  auto thread_copy = copy_a.get_thread_slice(thread);
  auto destination = thread_copy.retile_D(fragment);
  cute::copy(copy_a, thread_copy.partition_S(smem), destination);
}

// Issues C (+)= A B over all k blocks as one wgmma batch and commits it; the caller waits
// (warpgroup_wait<N>) when it needs the result. A comes from shared memory (descriptors) or
// from registers.
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorC>
CUTE_DEVICE void warpgroup_gemm(TiledMma& mma, TensorA& a, TensorB const& b, TensorC& c) {
  using namespace cute;
  constexpr bool kARegisters =
      !is_same_v<typename remove_cvref_t<TensorA>::engine_type::iterator, GMMA::DescriptorIterator>;
  if constexpr (kARegisters) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegisters) warpgroup_fence_operand(a);
}

}  // namespace flashattn::cuda::sm90
