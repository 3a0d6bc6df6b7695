#pragma once
// Device side of the mask policy (common/mask.hpp defines which keys a query row sees): the
// element-wise masking of a score tile. Which tiles a block visits: mask_tiles.cuh.
#include <cute/tensor.hpp>

#include "common/mask.hpp"
#include "cuda/common/mask_tiles.cuh"

namespace flashattn::cuda {

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
