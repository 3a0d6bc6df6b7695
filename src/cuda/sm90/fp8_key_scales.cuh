#pragma once
// Block quantization's K factors in the FP8 forward: one descale factor per block of
// kFp8ScaleBlockRows keys (common/problem.hpp, Descale). A key block of the kernel (128 or 192
// keys) spans one or two of those blocks, so its factor is read per 64-key chunk. It cannot join
// the tile's score scale as Q's does; instead the online softmax takes it per group of columns
// (DeferredOnlineSoftmax::step: the group's max scaled, the factor in the exponent's FFMA), and
// under softcap it joins the tanh's input scale: no instruction per score either way.
#include <cute/tensor.hpp>

#include "common/problem.hpp"

namespace flashattn::cuda::sm90 {

// The factors of a key block's 64-key chunks.
template <int kBlockN>
struct KeyChunkFactors {
  static_assert(kBlockN % 64 == 0 && kFp8ScaleBlockRows % 64 == 0, "each 64-key chunk lies in one block");
  static constexpr int kChunks = kBlockN / 64;
  float chunk[kChunks];
};

// A thread's (rows, kBlockN / 4) view (gmma_rowcol) of a 64 x kBlockN wgmma accumulator holds
// key 8 (c / 2) + 2 (lane % 4) + c % 2 in column c: column c's 64-key chunk is c / 16, whatever
// the lane, so a chunk is 16 consecutive columns.
constexpr int kKeyChunkColumns = 16;

// Read where the block's S = Q K^T is issued, so that the loads wait under the GEMM. key0: the
// block's first key (a multiple of 64); last_key: the sequence's. A chunk past the sequence's
// end takes the last block's factor: its scores are masked, but a factor is in their exponent's
// FFMA, and the descale entries past a shorter sequence's blocks need not hold numbers. Called by
// the blocked kernel only; all 1 without blocks (then K's factor is in the tile's).
template <int kBlockN>
CUTE_DEVICE KeyChunkFactors<kBlockN> key_chunk_factors(const detail::Descale& k, int batch, int head_kv, int key0,
                                                       int last_key) {
  KeyChunkFactors<kBlockN> f;
#pragma unroll
  for (int i = 0; i < KeyChunkFactors<kBlockN>::kChunks; ++i)
    f.chunk[i] = k.blocked() ? k.at(batch, head_kv, min(key0 + 64 * i, last_key)) : 1.f;
  return f;
}

}  // namespace flashattn::cuda::sm90
