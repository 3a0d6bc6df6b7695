#pragma once
// The order of a forward kernel's (query block, head, batch) tiles. The sm90 kernel is persistent
// (at most one CTA per SM): each CTA starts with tile blockIdx.x and then takes the next unclaimed
// index from a global counter when it runs out of work, so the order below is the order of
// execution, and no CTA idles while another has a queue. The sm80 kernel maps blockIdx.x through
// it for masked problems: the GPU starts CTAs in index order as slots free up, so there too it is
// close to the order of execution.
//
// Order: (batch, head) pairs are cut into sections whose K/V fit in a share of L2; within a
// section the longest query blocks come first (the last ones under a causal mask, whose
// diagonal is bottom-right aligned), then the heads of the section. So the CTAs that run
// together read the K/V of few heads (L2 reuse, also across the query heads of a GQA group,
// which are adjacent), and under a causal mask the long tiles start first and the short ones
// fill the tail. Longest-first balances the CTAs only within a section, and the last section's
// tiles are the last claimed: so the section that does not fill the share (the remainder of the
// pairs) comes first, and with a mask the last section is made large enough (3 tiles per CTA,
// as far as L2 holds its K/V) that its short tiles, not a few long ones, end the kernel.
#include "common/host_device.hpp"

namespace flashattn::cuda {

struct TileCoord {
  int m_block, head, batch;
};

struct TileOrder {
  int num_m_blocks = 0;
  int heads = 0;
  int batch = 0;
  // (batch, head) pairs per section: first `lead_heads` (0 or fewer than `section_heads`), then
  // sections of `section_heads`, then the last section of `last_heads` (at least section_heads,
  // or all pairs).
  int lead_heads = 0;
  int section_heads = 1;
  int last_heads = 1;
  // The product of the three counts, kept so that a kernel reads it from its parameters
  // rather than holding it in a register (the sm90 producer has 24 at head dim 256).
  int tiles = 0;

  FA_HOST_DEVICE int num_tiles() const { return tiles; }

  FA_HOST_DEVICE TileCoord tile(int index) const {
    const int pairs = heads * batch;
    const int last_first_pair = pairs - last_heads;
    const int lead_tiles = lead_heads * num_m_blocks;
    int first_pair, section_pairs, in_section;
    if (index >= last_first_pair * num_m_blocks) {
      first_pair = last_first_pair;
      section_pairs = last_heads;
      in_section = index - last_first_pair * num_m_blocks;
    } else if (index < lead_tiles) {
      first_pair = 0;
      section_pairs = lead_heads;
      in_section = index;
    } else {
      const int per_section = num_m_blocks * section_heads;
      const int section = (index - lead_tiles) / per_section;
      first_pair = lead_heads + section * section_heads;
      section_pairs = section_heads;
      in_section = index - lead_tiles - section * per_section;
    }
    const int m_rank = in_section / section_pairs;
    const int pair = first_pair + (in_section - m_rank * section_pairs);
    return {num_m_blocks - 1 - m_rank, pair % heads, pair / heads};
  }

  // K and V bytes per head of the order when `heads_sharing` of its heads read the same K and V
  // (a GQA group of query heads; 1 where the order's heads are KV heads).
  static long long kv_bytes_per_head(int seqlen_k, int head_dim, int element_bytes, int heads_sharing) {
    return 2LL * seqlen_k * head_dim * element_bytes / (heads_sharing > 0 ? heads_sharing : 1);
  }

  // kv_bytes_per_head: K and V bytes that one query head reads (shared by a GQA group, so
  // divided by the group size); l2_bytes: the device's L2; masked: causal or a window, whose
  // query blocks differ in length; ctas: how many CTAs run at once (the persistent grid, or the
  // GPU's resident slots).
  static TileOrder make(int num_m_blocks, int heads, int batch, long long kv_bytes_per_head,
                                      long long l2_bytes, bool masked, int ctas) {
    TileOrder s;
    s.num_m_blocks = num_m_blocks;
    s.heads = heads;
    s.batch = batch;
    // Clamped rather than overflowed: launches refuse more than 2^31 tiles before using it.
    const long long tiles = (long long)num_m_blocks * heads * batch;
    s.tiles = tiles < 0x7fffffffLL ? int(tiles) : 0x7fffffff;
    // A section's K/V: an eighth of L2 without a mask. With half of it (6 heads per section at
    // d = 128 n = 8k) a call on an H100 moved 1.8-2.1x the minimal DRAM bytes at d = 128 n = 2k-16k
    // and 1.4-1.6x at 1k, as K and V left L2 between the tiles of a head; with an eighth, close to
    // the minimum (docs/log/sm90-forward.md, DRAM traffic). Masked problems keep half: their
    // sections must hold enough long and short tiles for the longest-first order to balance the
    // CTAs, and at d = 128 n = 8k causal half of L2 was already at the minimum.
    const long long pairs = (long long)heads * batch;
    const long long budget = l2_bytes / (masked ? 2 : 8);
    long long per_section = kv_bytes_per_head > 0 ? budget / kv_bytes_per_head : pairs;
    if (per_section > pairs) per_section = pairs;
    if (per_section < 1) per_section = 1;  // also with no pairs at all: it divides below
    // The last section: with a mask at least 3 tiles per CTA, so that its longest-first order
    // ends on short tiles (docs/log/sm90-forward.md, the last section balanced), but no more K/V
    // than all of L2 holds.
    long long last = per_section;
    if (masked && num_m_blocks > 0) {
      long long balanced = (3LL * (ctas > 0 ? ctas : 1) + num_m_blocks - 1) / num_m_blocks;
      const long long fit = kv_bytes_per_head > 0 ? l2_bytes / kv_bytes_per_head : pairs;
      if (balanced > fit) balanced = fit;
      if (balanced > last) last = balanced;
    }
    if (last > pairs) last = pairs;
    s.section_heads = int(per_section);
    s.last_heads = int(last);
    s.lead_heads = int((pairs - last) % per_section);
    return s;
  }
};

}  // namespace flashattn::cuda
