#pragma once
// The mask at the granularity of tiles, in both directions: the key tiles a block of query rows
// visits and which of them need no element-wise masking (BlockMask, forward), and the query rows
// that see a block of keys (the backward walks the score matrix by key blocks). Plain C++ with
// no CuTe, so host code and host tests use the same arithmetic; the element-wise masking is in
// mask.cuh.
#include "common/host_device.hpp"
#include "common/mask.hpp"

namespace flashattn::cuda {

// Key tiles [begin, end) of kBlockN keys that a block of query rows visits.
struct KeyTileRange {
  int begin = 0;
  int end = 0;
  FA_HOST_DEVICE bool empty() const { return begin >= end; }
};

// The visible keys of query rows first_row..last_row (positions in the sequence) and the tiles
// that cover them. Since both bounds of a row's window grow with the row, the union is
// [begin(first_row), end(last_row)) and every key in [begin(last_row), end(first_row)) is
// visible to all of them.
struct BlockMask {
  int seqlen_q, seqlen_k, window_left, window_right;
  int first_row, last_row;

  FA_HOST_DEVICE detail::KeyRange row_keys(int row) const {
    return detail::visible_keys(row, seqlen_q, seqlen_k, window_left, window_right);
  }

  FA_HOST_DEVICE KeyTileRange tiles(int block_n) const {
    const int begin = row_keys(first_row).begin;
    const int end = row_keys(last_row).end;
    if (end <= begin) return {};
    return {begin / block_n, (end + block_n - 1) / block_n};
  }

  // True when no element of key tile `tile` is masked for any row of the block, so the tile can
  // skip element-wise masking.
  FA_HOST_DEVICE bool tile_fully_visible(int tile, int block_n) const {
    const int key0 = tile * block_n;
    return key0 >= row_keys(last_row).begin && key0 + block_n <= row_keys(first_row).end;
  }
};

// The query rows that see a block of keys (the backward).
struct QueryRows {
  int begin, end;  // [begin, end); empty when begin >= end
  FA_HOST_DEVICE bool empty() const { return begin >= end; }
};

// Rows of one sequence that see a key of [key_begin, key_end) (0 <= key_begin < key_end <=
// seqlen_k), under the normalized window of common/mask.hpp: row i sees key j iff
// j - shift - window_right <= i <= j - shift + window_left, shift = seqlen_k - seqlen_q.
FA_HOST_DEVICE QueryRows rows_seeing_keys(int seqlen_q, int seqlen_k, int window_left,
                                          int window_right, int key_begin, int key_end) {
  const int shift = seqlen_k - seqlen_q;
  QueryRows rows{0, seqlen_q};
  if (window_right >= 0 && key_begin - shift - window_right > rows.begin)
    rows.begin = key_begin - shift - window_right;
  if (window_left >= 0 && key_end + window_left - shift < rows.end)
    rows.end = key_end + window_left - shift;
  return rows;
}

}  // namespace flashattn::cuda
