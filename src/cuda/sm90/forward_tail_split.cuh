#pragma once
// The segments of a split tail tile (common/tail_split.cuh says which they are). Each segment
// writes its partial output (O unnormalized, its row max and this thread's part of the row sum)
// to a workspace slot; the segment that finishes last, as counted by the tile's arrival
// counter, merges the others into its registers and stores the tile. Nobody waits for anyone.
//
// Used where the output has shared memory of its own (ForwardTraits::kTailSplit): a segment
// that does not store must not leave a named barrier of the K/V staging half passed.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstddef>

#include "cuda/common/tail_split.cuh"

namespace flashattn::cuda::sm90 {

// Float2 chunks of one thread's partial output in a slot: the output pairs of its two rows
// (head dim / 4 columns each in a 64-row warpgroup's wgmma accumulator), then (max, sum) of each
// row. Stored chunk-major, so that a warpgroup's 128 threads write 1 KB at a time.
template <int kHeadDim>
constexpr int partial_chunks() {
  return 2 * (kHeadDim / 4) / 2 + 2;
}

// The end of a segment of a split tile, for one warpgroup (`barrier`: a named barrier of its
// 128 threads; `arrived`: an int of shared memory of its own). Writes the segment's partial
// output, counts its arrival at the tile and, if it is the tile's last segment, merges the
// others' partials into `out` and `softmax` (the caller then finalizes and stores as for a
// whole tile). Returns whether this warpgroup stores the tile.
template <int kWarpGroups, int kHeadDim, class Softmax, class Out>
CUTE_DEVICE bool finish_segment(TailSplit const& tail, float2* partials, int* arrivals, int& arrived, int segment_slot,
                                Softmax& softmax, Out& out, int warp_group, int lane, uint32_t barrier) {
  using namespace cute;
  constexpr int kRows = decltype(size<0>(out))::value;
  constexpr int kCols = decltype(size<1>(out))::value;
  constexpr int kChunks = partial_chunks<kHeadDim>();
  static_assert(kRows == 2 && kCols == kHeadDim / 4, "the layout partial_chunks assumes");
  auto chunks_of = [&](int slot) { return partials + (std::size_t(slot) * kWarpGroups + warp_group) * kChunks * 128 + lane; };

  float2* mine = chunks_of(segment_slot);
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; c += 2) mine[(r * kCols / 2 + c / 2) * 128] = make_float2(out(r, c), out(r, c + 1));
#pragma unroll
  for (int r = 0; r < kRows; ++r) mine[(kRows * kCols / 2 + r) * 128] = make_float2(softmax.max(r), softmax.sum(r));
  __threadfence();  // the partial is visible to the GPU before the arrival is counted
  cutlass::arch::NamedBarrier::sync(128, barrier);

  const int u = segment_slot / 2;
  const int t = tail.segment_tile(u, segment_slot % 2);
  const int first = tail.first_unit(t), last = tail.last_unit(t);
  int* counter = arrivals + t * kWarpGroups + warp_group;
  if (lane == 0) arrived = atomicAdd(counter, 1);
  cutlass::arch::NamedBarrier::sync(128, barrier);
  // (Lane 0 writes `arrived` again only after the next segment's first barrier, which every
  // thread reaches after this read.)
  if (arrived != last - first) return false;

  __threadfence();  // the others' partials, which their arrivals published
  for (int v = first; v <= last; ++v) {
    const int slot = tail.slot_in_tile(v, t);
    if (slot == segment_slot) continue;
    const float2* theirs = chunks_of(slot);
    float their_max[kRows], their_sum[kRows], mine_scale[kRows], their_scale[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float2 state = __ldcg(theirs + (kRows * kCols / 2 + r) * 128);
      their_max[r] = state.x;
      their_sum[r] = state.y;
    }
    softmax.merge(their_max, their_sum, mine_scale, their_scale);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; c += 2) {
        const float2 o = __ldcg(theirs + (r * kCols / 2 + c / 2) * 128);
        out(r, c) = out(r, c) * mine_scale[r] + o.x * their_scale[r];
        out(r, c + 1) = out(r, c + 1) * mine_scale[r] + o.y * their_scale[r];
      }
  }
  return true;
}

}  // namespace flashattn::cuda::sm90
