#pragma once
// Device side of the mask policy (common/mask.hpp defines which keys a query row sees):
// which key tiles a block of query rows must visit, which of those need element-wise
// masking, and the element-wise masking itself.
#include <cute/tensor.hpp>

#include "common/mask.hpp"

namespace flashattn::cuda {

// Key tiles [begin, end) of kBlockN keys that a block of query rows visits.
struct KeyTileRange {
  int begin = 0;
  int end = 0;
  CUTE_HOST_DEVICE bool empty() const { return begin >= end; }
};

// The visible keys of query rows first_row..last_row (positions in the sequence) and the tiles
// that cover them. Since both bounds of a row's window grow with the row, the union is
// [begin(first_row), end(last_row)) and every key in [begin(last_row), end(first_row)) is
// visible to all of them.
struct BlockMask {
  int seqlen_q, seqlen_k, window_left, window_right;
  int first_row, last_row;

  CUTE_HOST_DEVICE detail::KeyRange row_keys(int row) const {
    return detail::visible_keys(row, seqlen_q, seqlen_k, window_left, window_right);
  }

  CUTE_HOST_DEVICE KeyTileRange tiles(int block_n) const {
    const int begin = row_keys(first_row).begin;
    const int end = row_keys(last_row).end;
    if (end <= begin) return {};
    return {begin / block_n, (end + block_n - 1) / block_n};
  }

  // True when no element of key tile `tile` is masked for any row of the block, so the tile can
  // skip element-wise masking.
  CUTE_HOST_DEVICE bool tile_fully_visible(int tile, int block_n) const {
    const int key0 = tile * block_n;
    return key0 >= row_keys(last_row).begin && key0 + block_n <= row_keys(first_row).end;
  }
};

// Sets to -inf every score whose key lies outside its row's visible range.
// scores: (rows, cols) per thread; key_of(r, c) gives the key index of element (r, c);
// row_range[r] is the visible key range of the thread's row r.
template <class Scores, class KeyOf, int kRows>
CUTE_DEVICE void mask_scores(Scores& scores, KeyOf key_of, const detail::KeyRange (&row_range)[kRows]) {
  using namespace cute;
  static_assert(decltype(size<0>(scores))::value == kRows);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < size<1>(scores); ++c) {
      const int key = key_of(r, c);
      if (key < row_range[r].begin || key >= row_range[r].end) scores(r, c) = -INFINITY;
    }
  }
}

}  // namespace flashattn::cuda
