#pragma once
// Tuning decisions of the sm90 forward: the key-block width per head dim, the tile height per
// problem.

// Key-block sizes for head dims 65-128, 192 and 256 (tuning knobs for measurements; see
// docs/kernels/sm90-forward.md).
#ifndef FLASHATTN_SM90_BLOCK_N_HD128
#define FLASHATTN_SM90_BLOCK_N_HD128 128
#endif
#ifndef FLASHATTN_SM90_BLOCK_N_HD192
#define FLASHATTN_SM90_BLOCK_N_HD192 112
#endif
#ifndef FLASHATTN_SM90_BLOCK_N_HD256
#define FLASHATTN_SM90_BLOCK_N_HD256 80
#endif
// Up to this head dim a consumer warpgroup keeps its Q rows in registers for the tile (S = Q K^T
// with A from registers); above it Q stays in shared memory (its fragment would not fit).
#ifndef FLASHATTN_SM90_Q_IN_REGISTERS_UP_TO
#define FLASHATTN_SM90_Q_IN_REGISTERS_UP_TO 128
#endif

namespace flashattn::cuda::sm90 {

// Keys per K/V block: 128 up to head dim 128, fewer above, so that two stages each of K and V
// fit in shared memory beside Q (forward_traits.cuh).
constexpr int key_block_cols(int head_dim) {
  if (head_dim <= 64) return 128;
  if (head_dim <= 128) return FLASHATTN_SM90_BLOCK_N_HD128;
  return head_dim <= 192 ? FLASHATTN_SM90_BLOCK_N_HD192 : FLASHATTN_SM90_BLOCK_N_HD256;
}

// Keys per K/V block of the FP8 forward: a multiple of 32 (the k of an 8-bit wgmma, which P.V
// reduces over keys); at one byte per element two stages of K and of V^T fit beside Q even at
// head dim 256. For head dims 65-128, 192 keys ran 1.4-7.1% faster than 128 on an H100 (16k tokens,
// docs/kernels/fp8-forward.md), with 28 bytes of spill stores; 256 spilled 304 bytes (ptxas).
#ifndef FLASHATTN_SM90_FP8_BLOCK_N_HD128
#define FLASHATTN_SM90_FP8_BLOCK_N_HD128 192
#endif
// `rows`: the tile's query rows. 192-row tiles at head dims 65-128 run the serial mainloop
// (forward_traits.cuh) on 128-key blocks, which fit its 160 registers (160 keys spilled 1648 bytes,
// ptxas, 2026-11-29).
constexpr int fp8_key_block_cols(int head_dim, int rows = 128) {
  if (rows == 192) return 128;
  return head_dim > 64 && head_dim <= 128 ? FLASHATTN_SM90_FP8_BLOCK_N_HD128 : 128;
}

// Pages of V per key block that the paged forward's value loader brings by TMA boxes (one 5-D
// box a page, page_box_maps.cuh) instead of cp.async rows, so that both paths carry a share of a
// block (forward_paged_kv.cuh: run_value_loader): as many as leave each group of the loader's
// cp.async threads one page. Measured (H200, 2026-11-28, pages of 16, 8k keys): 2 at head dim 128
// (8 pages, 6 groups) 0.91x the time of none, 3 level with 2; 3 at 192 (7 pages, 4 groups) 0.90x;
// 2 at 256 (5 pages, 3 groups) 0.88x, 1 1.05x. Head dims without page boxes (Traits::kPageBoxes)
// take none.
constexpr int paged_value_box_pages(int head_dim) {
  if (head_dim <= 96) return 0;
  if (head_dim <= 128) return 2;
  return head_dim <= 192 ? 3 : 2;
}

// FP8: whether the kernel writes V^T itself (fp8_value_transposer.cuh) instead of the launch's
// pre-pass (fp8_value_transpose.cuh). In the kernel every query tile transposes each V block it
// reads, so the cost grows with the query rows that read a KV head's V (seqlen_q x the query heads
// that share it); the pre-pass moves V once a call (17 us at 16k tokens x hidden 2048) and adds
// twice V's bytes to the call's memory traffic. The transposer on every call against the pre-pass
// (H200, 2026-11-29, against 0eb2426; docs/kernels/fp8-forward.md): d = 128 1.21-1.35x decoding
// (1-16 queries x 4 heads over 4k-32k keys), 1.11-1.13x at 512 rows over 32k keys, +11% / +2-7% /
// -1 to +1.5% / -2 to -4% at 1k / 2k / 4k / 16k rows without GQA; d = 256 1.16-1.19x decoding,
// 0.97x at 512 rows over 32k keys, -1% at 1k, -6% at 2k, -7 to -14% from 4k.
constexpr long long fp8_in_kernel_transpose_max_rows(int head_dim) { return head_dim <= 128 ? 2048 : 128; }
inline bool fp8_transposes_value_in_kernel(int head_dim, int seqlen_q, int group) {
  return (long long)seqlen_q * group <= fp8_in_kernel_transpose_max_rows(head_dim);
}

// Whether three consumer warpgroups' fragments fit at this head dim: up to 64, or up to 128 for FP8
// (its serial mainloop). The traits, the launch and the rule below all ask this.
constexpr bool tall_tiles_fit(int head_dim, bool fp8) { return head_dim <= (fp8 ? 128 : 64); }

// Query rows per tile: 128 (two consumer warpgroups), or up to head dim 64 192 (three), which
// ran 9-12% faster per row on long sequences (H100; docs/log/sm90-forward.md has each figure
// under its date). A warpgroup whose 64 rows all lie past the end of a sequence skips its GEMMs
// and softmax, and under a mask each warpgroup visits only the key blocks its own rows see, so
// padding costs little: the choice is about waves. A 192-row tile took about 1.25x as long as a
// 128-row one at n = 1k; take it when its waves, weighted so, are fewer. Masked problems used to
// take 192 rows only where they padded at most 4% more rows than 128; since the tile order ends on
// short tiles, 192 rows ran 4% faster at n = 1k causal and 9% at 512, so the same rule serves
// both. `heads_x_batch`: query heads times batch. With dropout always 128: it ran level or faster
// there (H100, 2026-11-27: 3-6% at n = 1k, within 1% at 4k and 16k; docs/log/sm90-forward.md),
// and so there is no 192-row dropout kernel. Paged K/V takes the same rule as contiguous K/V
// (a 192-row paged kernel at d = 64 since 2026-11-28: docs/kernels/kv-cache.md).
// FP8 (`fp8`) takes the rule up to head dim 128: its 192-row tiles at d = 65-128 run each
// warpgroup's key blocks one after the other (forward_traits.cuh: kSerialMainloop), 0-15% faster
// than 128 rows at 16k tokens (H200, 2026-11-29; docs/kernels/fp8-forward.md).
inline int query_block_rows(int head_dim, int seqlen_q, long long heads_x_batch, int sm_count, bool dropout,
                            bool fp8 = false) {
  if (!tall_tiles_fit(head_dim, fp8) || dropout) return 128;
  const long long n = seqlen_q > 0 ? seqlen_q : 1;
  const long long sms = sm_count > 0 ? sm_count : 1;
  const long long waves_128 = ((n + 127) / 128 * heads_x_batch + sms - 1) / sms;
  const long long waves_192 = ((n + 191) / 192 * heads_x_batch + sms - 1) / sms;
  return waves_192 * 5 < waves_128 * 4 ? 192 : 128;
}

}  // namespace flashattn::cuda::sm90
