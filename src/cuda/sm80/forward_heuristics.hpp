#pragma once
// Every tuning decision of the sm80 forward in one place: tile shapes per head dim, when query
// heads are packed into rows (GQA decoding), when the decode tiles are used, and how many ways
// the keys are split (flash-decoding). Host code only.
#include <algorithm>
#include <cmath>

#include "common/problem.hpp"

namespace flashattn::cuda::sm80 {

struct TileShape {
  int block_m, block_n, warps;
};

// Long queries: compute-bound tiles. 128 query rows per CTA; 8 warps from d = 192 so that the
// O accumulator stays at <= 128 floats per thread. Measured on an H100 (bf16, 16k tokens):
// d = 128: 128x64/4 warps beat 128x128/8, 128x32/4 and 64x64/4 by 3-25%; d = 64: 128x64 and
// 128x128 tie, and 128x64 does not spill (128x128 spills 128 bytes); d = 256: 128x64/8 and
// 64x64/4 tie.
constexpr TileShape prefill_tiles(int width) {
  if (width <= 32) return {128, 128, 4};
  if (width <= 128) return {128, 64, 4};
  return {128, 64, 8};
}

// Short queries (decoding): 64 rows (a smaller M keeps the tensor-core work per byte of K/V
// low), key tiles of 128 (64 from d = 192, for registers). Bandwidth-bound.
constexpr TileShape decode_tiles(int width) {
  if (width <= 128) return {64, 128, 4};
  return {64, 64, 4};
}

// Prefill at head dim 256 on short query sequences: the decode tile (64 x 64, 4 warps) rather
// than 128 x 64 with 8 warps. H100, bf16, 16k tokens (docs/log/sm80-forward.md, 2026-11-23): at
// n = 1k the short tile was 10% faster causal and 2.5% without a mask; at n = 4k the tall one was
// 3% faster without a mask (1% slower causal). Half the rows per CTA and two CTAs per SM (96 KB
// against 128 KB) balance short and masked work better; long unmasked rows gain more from the
// tall tile's reuse of each K/V tile. Not measured at d = 192, nor between 1k and 4k, nor with
// query heads packed into rows (pack > 1), which keep the tall tile.
inline bool short_prefill_tiles(int head_dim, int seqlen_q, int pack) {
  return head_dim > 192 && seqlen_q <= 1024 && pack == 1;
}

// GQA: pack the query heads of a group into the rows of one tile, so that one CTA streams each
// K/V tile once for the whole group, when queries are short enough that the unpacked query
// blocks would be mostly empty.
inline int choose_pack(const detail::Problem& p, TileShape prefill) {
  const int group = p.group_size();
  return group > 1 && p.seqlen_q <= prefill.block_m / 2 ? group : 1;
}

inline bool use_decode_tiles(const detail::Problem& p, int pack, TileShape decode) {
  return std::int64_t(p.seqlen_q) * pack <= decode.block_m;
}

// The tiles that run a problem on the kernels of width `width`: GQA packing, and whether the
// decode tile (64 rows; also the short-prefill tile above) takes it. Dropout runs the prefill
// tile with query heads never packed (its random stream is laid out per query head).
struct TileChoice {
  int pack;
  bool decode;
};
inline TileChoice choose_tiles(const detail::ForwardProblem& p, int width) {
  if (p.dropout.enabled()) return {1, false};
  const int pack = choose_pack(p, prefill_tiles(width));
  return {pack, use_decode_tiles(p, pack, decode_tiles(width)) || short_prefill_tiles(width, p.seqlen_q, pack)};
}

// A KV-cache call's append + rotary in the decode kernel itself (sm80/fused_append.cuh) rather
// than a kernel of its own before it: on the decode tile, and for at most kFusedAppendMaxRows
// new rows, since every split of a sequence writes all of them. Calls that launch nothing (no
// sequence or no query row) keep the separate kernel, which still appends.
constexpr int kFusedAppendMaxRows = 16;
inline bool fuses_kv_append(const detail::ForwardProblem& p, int width, const detail::KvAppend& a) {
  return (a.appends() || a.rotates()) && a.seqlen_new <= kFusedAppendMaxRows && p.batch > 0 && p.seqlen_q > 0 &&
         choose_tiles(p, width).decode;
}

// Keys one query block visits at most (for the split count): all of them, unless a left window
// bounds them.
inline int visited_keys(const detail::Problem& p, int pack, TileShape tiles) {
  int keys = p.seqlen_k;
  if (p.window_left >= 0) {
    const int positions = std::min(p.seqlen_q, std::max(1, tiles.block_m / pack));
    const long long span = 1LL + p.window_left + positions + std::max(p.window_right, 0);
    keys = int(std::min<long long>(keys, span));
  }
  return keys;
}

// Split-KV: when the CTAs do not fill the GPU (ctas below 80% of the resident slots), split each
// query block's key tiles over several CTAs. Takes the fewest splits whose last wave is nearly
// as full as the best achievable (FlashAttention-2's rule), skipping split counts that do not
// change the tiles per split. `slots` = SMs x CTAs resident per SM.
inline int choose_num_splits(long long ctas, int key_tiles, int slots, int max_splits = 128) {
  if (ctas <= 0 || key_tiles <= 1 || ctas >= 0.8 * slots) return 1;
  max_splits = std::min({max_splits, key_tiles, slots});
  auto efficiency = [&](int s) {
    const double waves = double(ctas) * s / slots;
    return waves / std::ceil(waves);
  };
  auto useful = [&](int s) {
    return s == 1 || (key_tiles + s - 1) / s != (key_tiles + s - 2) / (s - 1);
  };
  double best = 0;
  for (int s = 1; s <= max_splits; ++s)
    if (useful(s)) best = std::max(best, efficiency(s));
  for (int s = 1; s <= max_splits; ++s)
    if (useful(s) && efficiency(s) >= 0.85 * best) return s;
  return 1;
}

}  // namespace flashattn::cuda::sm80
