#pragma once
// Tuning decisions of the sm90 forward that depend on the problem, not just the head dim.

namespace flashattn::cuda::sm90 {

// Query rows per tile. Up to head dim 64, 192-row tiles (three consumer warpgroups) ran 9-12%
// faster than 128-row ones on long sequences (H100, NOTES.md run 7), but they pad the last tile
// of every sequence more (n = 1024: 1152 rows computed instead of 1024): take them unless they
// compute more than 4% more rows than 128-row tiles would.
inline int query_block_rows(int head_dim, int seqlen_q) {
  if (head_dim > 64) return 128;
  const long long n = seqlen_q > 0 ? seqlen_q : 1;
  const long long rows_128 = (n + 127) / 128 * 128, rows_192 = (n + 191) / 192 * 192;
  return rows_192 * 100 <= rows_128 * 104 ? 192 : 128;
}

}  // namespace flashattn::cuda::sm90
