#pragma once
// The mask seen from a block of keys: which query rows see at least one of its keys. The
// backward walks the score matrix by key blocks; common/mask.cuh (BlockMask) covers the other
// direction and the per-tile tests.
#include "common/host_device.hpp"

namespace flashattn::cuda {

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
