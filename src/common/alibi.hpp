#pragma once
// ALiBi (attention with linear biases), the score policy shared by every backend, host and
// device. With slopes given, the score of query row i and key j of a sequence becomes
//   score(i, j) + bias(i, j),   bias(i, j) = -slope(b, h) * |i + seqlen_k - seqlen_q - j|
// after the softmax scale and after soft-capping, before the softmax: the distance is taken
// from the bottom-right aligned diagonal (common/mask.hpp), with the lengths of the sequence
// itself under variable length. ALiBi never masks: which keys a row sees (and so which tiles
// a kernel skips) is the mask's business alone.
//
// flash-attn 2 adds the same bias, except that its causal kernels add slope * j instead: equal
// to the bias above plus slope * (i + seqlen_k - seqlen_q), a constant per row, so outputs and
// gradients are the same and only its LSE differs (flash-attn's = ours + that constant).
#include <cstdint>

#include "common/host_device.hpp"

namespace flashattn::detail {

// Slopes in float32: (heads_q,) (batch_stride 0) or (batch, heads_q). data == nullptr: no ALiBi.
struct AlibiSlopes {
  const float* data = nullptr;
  std::int64_t batch_stride = 0;

  FA_HOST_DEVICE bool enabled() const { return data != nullptr; }
  FA_HOST_DEVICE float slope(int b, int h) const { return data[b * batch_stride + h]; }
};

// The distance of key `key` from row `row`'s diagonal, as a float (exact below 2^24).
FA_HOST_DEVICE float alibi_distance(int row, int key, int seqlen_q, int seqlen_k) {
  const int d = row + seqlen_k - seqlen_q - key;
  return float(d < 0 ? -d : d);
}

FA_HOST_DEVICE float alibi_bias(float slope, int row, int key, int seqlen_q, int seqlen_k) {
  return -slope * alibi_distance(row, key, seqlen_q, seqlen_k);
}

}  // namespace flashattn::detail
