#pragma once
// Which keys a query row may see, shared by every backend (host and device).
//
// With seqlen_q != seqlen_k the diagonal is aligned to the bottom-right corner: query row i
// corresponds to key position i + (seqlen_k - seqlen_q). Query i sees key j iff
//   j >= i + shift - window_left   (when window_left  >= 0)
//   j <= i + shift + window_right  (when window_right >= 0)
// and 0 <= j < seqlen_k.
#include "common/host_device.hpp"

namespace flashattn::detail {

struct KeyRange {
  int begin;  // first visible key (inclusive)
  int end;    // one past the last visible key; begin >= end means the row sees nothing
};

FA_HOST_DEVICE KeyRange visible_keys(int row, int seqlen_q, int seqlen_k, int window_left,
                                     int window_right) {
  const int diag = row + seqlen_k - seqlen_q;
  int begin = 0, end = seqlen_k;
  if (window_left >= 0 && diag - window_left > begin) begin = diag - window_left;
  if (window_right >= 0 && diag + window_right + 1 < end) end = diag + window_right + 1;
  return {begin, end};
}

// flash-attn's window arguments, normalized (flash_api.cpp's rules, shared by the API layer and
// the command line): causal sets window_right = 0 whatever was given; a size >= seqlen_k (the
// maximum under variable length) is unbounded (-1); so is a right bound >= seqlen_q, which can
// never cut.
struct Window {
  int left, right;
};

FA_HOST_DEVICE Window normalized_window(bool causal, int window_left, int window_right, int seqlen_q,
                                        int seqlen_k) {
  int left = window_left, right = causal ? 0 : window_right;
  if (left >= seqlen_k) left = -1;
  if (right > 0 && (right >= seqlen_k || right >= seqlen_q)) right = -1;
  return {left, right};
}

}  // namespace flashattn::detail
