// Tile choices made on the host, and that the shared case table reaches each of them with
// enough tiles to run several per CTA (so a wrong choice or a broken tile shape shows up in
// the GPU suite, not only in benchmarks).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/common/mask_tiles.cuh"
#include "cuda/common/tail_split.cuh"
#include "cuda/common/tile_order.cuh"
#include "cuda/sm80/forward_heuristics.hpp"
#include "cuda/sm90/api.hpp"
#include "cuda/sm90/backward_claim_order.hpp"
#include "cuda/sm90/forward_heuristics.hpp"
#include "cuda/sm90/page_box_coords.hpp"
#include "support/cases.hpp"
#include "support/kv_cases.hpp"

namespace flashattn::testing {
namespace {

using cuda::sm90::query_block_rows;

constexpr int kSms = 132;  // H100 SXM / H200

TEST(Sm90TileChoice, TallTilesAtSmallHeadDimsWhenTheyTakeFewerWaves) {
  EXPECT_EQ(query_block_rows(128, 4096, 1024, kSms, false), 128);
  EXPECT_EQ(query_block_rows(256, 192, 1024, kSms, false), 128);
  // 16k tokens, 32 heads: 32 waves of 128-row tiles against 24 of 192-row ones (also causal:
  // 1152 padded rows against 1024 ran 4% faster, docs/log/sm90-forward.md, 2026-11-25).
  EXPECT_EQ(query_block_rows(64, 1024, 16 * 32, kSms, false), 192);
  EXPECT_EQ(query_block_rows(64, 512, 32 * 32, kSms, false), 192);  // 16 against 12 waves
  EXPECT_EQ(query_block_rows(64, 16384, 32, kSms, false), 192);
  // As many waves either way: the shorter tile.
  EXPECT_EQ(query_block_rows(64, 1024, 2 * 16, kSms, false), 128);  // 2 waves each
  EXPECT_EQ(query_block_rows(64, 2048, 8, kSms, false), 128);       // 1 wave each
  EXPECT_EQ(query_block_rows(64, 1, 1024, kSms, false), 128);
  // Dropout: always 128 rows (there is no 192-row dropout kernel).
  EXPECT_EQ(query_block_rows(64, 1024, 16 * 32, kSms, true), 128);
  // CudaPagedVarlen.TallTiles: 300 queries, 3 x 4 heads on one SM (sm_margin) take 192-row tiles.
  EXPECT_EQ(query_block_rows(64, 300, 3 * 4, 1, false), 192);
  // FP8 takes the rule up to head dim 128 (its serial mainloop), not above; 16-bit inputs keep
  // 128 rows at d = 128.
  EXPECT_EQ(query_block_rows(128, 4096, 4 * 16, kSms, false, true), 192);  // 16k tokens: 16 against 11 waves
  EXPECT_EQ(query_block_rows(128, 1024, 16 * 16, kSms, false, true), 192);
  EXPECT_EQ(query_block_rows(128, 2048, 8, kSms, false, true), 128);  // 1 wave each
  EXPECT_EQ(query_block_rows(256, 4096, 4 * 8, kSms, false, true), 128);
  EXPECT_EQ(query_block_rows(128, 4096, 4 * 16, kSms, false, false), 128);
}

// Which paged pools the sm90 forward reads one 5-D TMA box a page from (page_box_coords.hpp), and
// the coordinates it gives the KV head: the pools of CudaPagedVarlen.PoolLayouts (contiguous and
// heads-major take boxes, padded heads do not), a head dim below the kernel's, K and V laid out
// differently.
TEST(Sm90TileChoice, PagedPoolsThatTakeOnePageBox) {
  using cuda::sm90::page_box_coords;
  const std::int32_t table[1] = {0};
  auto problem = [&](int head_dim, std::int64_t page_stride, std::int64_t row_stride, std::int64_t head_stride) {
    detail::ForwardProblem p;
    p.head_dim = head_dim;
    p.heads_kv = 2;
    p.kv.pages.block_table = table;
    p.kv.pages.page_size = 16;
    p.kv.pages.num_pages = 10;
    p.k = p.v = detail::SeqTensor{nullptr, page_stride, row_stride, head_stride};
    return p;
  };
  const auto contiguous = page_box_coords(problem(128, 16 * 2 * 128, 2 * 128, 128), 128, 64);
  EXPECT_TRUE(contiguous.usable);  // heads share the atom-column coordinate: 2 atom columns a head
  EXPECT_EQ(contiguous.column_per_head, 2);
  EXPECT_EQ(contiguous.outer_per_page, 1);
  EXPECT_EQ(contiguous.outer_per_head, 0);
  const auto heads_major = page_box_coords(problem(128, 2 * 16 * 128, 128, 16 * 128), 128, 64);
  EXPECT_TRUE(heads_major.usable);  // heads share the page coordinate
  EXPECT_EQ(heads_major.column_per_head, 0);
  EXPECT_EQ(heads_major.outer_per_page, 2);
  EXPECT_EQ(heads_major.outer_per_head, 1);
  EXPECT_FALSE(page_box_coords(problem(128, 16 * 2 * 136, 2 * 136, 136), 128, 64).usable);  // padded heads
  EXPECT_FALSE(page_box_coords(problem(96, 16 * 2 * 96, 2 * 96, 96), 128, 64).usable);      // narrower head
  auto mixed = problem(128, 16 * 2 * 128, 2 * 128, 128);
  mixed.v = detail::SeqTensor{nullptr, 2 * 16 * 128, 128, 16 * 128};
  EXPECT_FALSE(page_box_coords(mixed, 128, 64).usable);  // K and V need one set of coordinates
  auto contiguous_query = problem(128, 16 * 2 * 128, 2 * 128, 128);
  contiguous_query.kv.pages.block_table = nullptr;
  EXPECT_FALSE(page_box_coords(contiguous_query, 128, 64).usable);  // not paged
}

long long tiles(const Case& c, int rows) {
  return (c.seqlen_q + rows - 1) / rows * (long long)c.heads_q * c.batch;
}

int rows_for(const Case& c, bool fp8 = false) {
  return query_block_rows(c.head_dim, c.seqlen_q, (long long)c.heads_q * c.batch, kSms, c.dropout_p > 0, fp8);
}

TEST(Sm90TileChoice, SharedTableRunsEveryTileHeightOverManyTiles) {
  bool tall = false, regular = false;
  for (const Case& c : shared_cases(TableFor::cuda)) {
    if (c.varlen() || c.head_dim % 16 != 0 || c.head_dim > 256) continue;
    const int rows = rows_for(c);
    if (tiles(c, rows) <= kSms) continue;
    (rows == 192 ? tall : regular) = true;
  }
  EXPECT_TRUE(tall) << "no case runs 192-row tiles several per CTA";
  EXPECT_TRUE(regular) << "no case runs 128-row tiles several per CTA";
}

// The FP8 forward takes 192-row tiles by the same rule, up to head dim 128: its table must reach
// them (at d = 64, and at d = 65-128, where they run the serial mainloop) and 128-row tiles.
TEST(Sm90TileChoice, Fp8TableRunsEveryTileHeightOverManyTiles) {
  bool tall = false, serial = false, regular = false, regular_hd128 = false;
  for (const Case& c : fp8_cases()) {
    if (c.varlen() || c.head_dim > 256) continue;
    const int rows = rows_for(c, true);
    if (tiles(c, rows) <= kSms) continue;
    (rows == 192 ? (c.head_dim > 64 ? serial : tall) : (c.head_dim > 64 && c.head_dim <= 128 ? regular_hd128 : regular)) =
        true;
  }
  EXPECT_TRUE(tall) << "the FP8 table has no case at d <= 64 with more 192-row tiles than SMs";
  EXPECT_TRUE(serial) << "the FP8 table has no case at d = 65-128 with more 192-row tiles than SMs";
  EXPECT_TRUE(regular) << "the FP8 table has no case at d = 129-256 with more 128-row tiles than SMs";
  EXPECT_TRUE(regular_hd128) << "the FP8 table has no case at d = 65-128 with more 128-row tiles than SMs";
}

// FP8: V^T written in the kernel where few query rows read each KV head's V (seqlen_q x group),
// by the launch's pre-pass where many do (forward_heuristics.hpp).
TEST(Sm90TileChoice, Fp8WritesValueTransposeInTheKernelForFewRowsPerKvHead) {
  using cuda::sm90::fp8_transposes_value_in_kernel;
  EXPECT_TRUE(fp8_transposes_value_in_kernel(128, 1, 8));     // decoding: 1.21-1.35x (H200)
  EXPECT_TRUE(fp8_transposes_value_in_kernel(128, 1024, 1));  // +11%
  EXPECT_TRUE(fp8_transposes_value_in_kernel(128, 2048, 1));  // +2-7%
  EXPECT_FALSE(fp8_transposes_value_in_kernel(128, 4096, 1));  // -1 to +1.5%
  EXPECT_FALSE(fp8_transposes_value_in_kernel(128, 1024, 4));  // 4096 rows read each V
  EXPECT_TRUE(fp8_transposes_value_in_kernel(64, 512, 4));
  EXPECT_TRUE(fp8_transposes_value_in_kernel(256, 16, 4));     // decoding: 1.16-1.19x
  EXPECT_FALSE(fp8_transposes_value_in_kernel(256, 512, 1));  // 0.97x
  EXPECT_FALSE(fp8_transposes_value_in_kernel(256, 1024, 1));
}

// The FP8 table reaches both ways of writing V^T on every tile shape (d <= 64 on 192 and 128
// rows, d = 65-128 on 192 rows (the serial mainloop) and 128, above on 128), each with more tiles
// than SMs somewhere, so that a CTA runs several tiles through the transposer's pipelines.
TEST(Sm90TileChoice, Fp8TableRunsBothValueTransposesOnEveryTileShape) {
  std::set<std::tuple<int, int, bool>> reached, reached_many;  // (head-dim class, rows, in kernel)
  for (const Case& c : fp8_cases()) {
    if (c.head_dim > 256) continue;
    const int rows = rows_for(c, true);
    const int dims = c.head_dim <= 64 ? 0 : c.head_dim <= 128 ? 1 : 2;
    const bool in_kernel = cuda::sm90::fp8_transposes_value_in_kernel(c.head_dim, c.seqlen_q, c.heads_q / c.heads_kv);
    reached.insert({dims, rows, in_kernel});
    if (!c.varlen() && tiles(c, rows) > kSms) reached_many.insert({dims, rows, in_kernel});
  }
  for (const auto& [dims, rows] : {std::pair{0, 192}, {0, 128}, {1, 192}, {1, 128}, {2, 128}})
    for (const bool in_kernel : {true, false})
      EXPECT_TRUE(reached.count({dims, rows, in_kernel}))
          << "no FP8 case at head-dim class " << dims << " on " << rows << "-row tiles with V^T written "
          << (in_kernel ? "in the kernel" : "by the pre-pass");
  for (const int dims : {1, 2})
    for (const bool in_kernel : {true, false}) {
      bool any = false;
      for (const int rows : {128, 192}) any = any || reached_many.count({dims, rows, in_kernel});
      EXPECT_TRUE(any) << "no FP8 case at head-dim class " << dims << " with more tiles than SMs and V^T written "
                       << (in_kernel ? "in the kernel" : "by the pre-pass");
    }
}

// FP8 at d = 65-128 on 192-row tiles runs the serial mainloop (forward_consumer.cuh), whose
// warpgroups sit out key blocks on paths of their own: a warpgroup with no rows in the sequence,
// one that sees fewer key blocks than its tile (a causal diagonal) and one whose first block comes
// after its tile's (a window). The FP8 table must reach each, with the serial mainloop's key blocks.
TEST(Sm90TileChoice, Fp8TableRunsTheSerialMainloopsSitOuts) {
  bool idle = false, skips_last = false, skips_first = false;
  for (const Case& c : fp8_cases()) {
    if (c.varlen() || c.head_dim <= 64 || c.head_dim > 128 || rows_for(c, true) != 192) continue;
    auto blocks = [&](int first, int last) {
      const cuda::BlockMask mask{c.seqlen_q, c.seqlen_k, c.window_left, c.causal ? 0 : c.window_right, first, last};
      return mask.tiles(cuda::sm90::fp8_key_block_cols(c.head_dim, 192));
    };
    for (int row0 = 0; row0 < c.seqlen_q; row0 += 192) {
      const int last = std::min(row0 + 192, c.seqlen_q) - 1;
      const cuda::KeyTileRange tile = blocks(row0, last);
      if (tile.empty()) continue;
      for (int first = row0; first < row0 + 192; first += 64) {
        if (first > last) {
          idle = true;
          continue;
        }
        const cuda::KeyTileRange mine = blocks(first, std::min(first + 63, last));
        if (mine.empty()) continue;
        if (mine.end < tile.end) skips_last = true;
        if (mine.begin > tile.begin) skips_first = true;
      }
    }
  }
  EXPECT_TRUE(idle) << "no serial-mainloop tile has a warpgroup without rows";
  EXPECT_TRUE(skips_last) << "no serial-mainloop tile has a warpgroup that sees fewer key blocks than its tile";
  EXPECT_TRUE(skips_first) << "no serial-mainloop tile has a warpgroup whose first key block comes after its tile's";
}

// A warpgroup whose 64 rows lie past the sequence takes a path of its own in the consumer
// (forward_consumer.cuh): the table must reach it for both tile heights, between full tiles.
TEST(Sm90TileChoice, SharedTableRunsIdleWarpgroupsOverManyTiles) {
  bool tall = false, regular = false;
  for (const Case& c : shared_cases(TableFor::cuda)) {
    if (c.varlen() || c.head_dim % 16 != 0 || c.head_dim > 256) continue;
    const int rows = rows_for(c);
    const int last_tile_rows = c.seqlen_q % rows;
    if (tiles(c, rows) <= kSms || last_tile_rows == 0 || last_tile_rows > rows - 64) continue;
    (rows == 192 ? tall : regular) = true;
  }
  EXPECT_TRUE(tall) << "no case leaves a warpgroup of a 192-row tile idle";
  EXPECT_TRUE(regular) << "no case leaves a warpgroup of a 128-row tile idle";
}

// Key blocks [begin, end) that query rows first..last see, as the sm90 producer and consumers
// count them (causal is window_right = 0, as the API normalizes it).
cuda::KeyTileRange key_blocks(const Case& c, int first, int last) {
  const cuda::BlockMask mask{c.seqlen_q, c.seqlen_k, c.window_left, c.causal ? 0 : c.window_right, first, last};
  return mask.tiles(cuda::sm90::key_block_cols(c.head_dim));
}

// Each consumer warpgroup computes only the key blocks its own 64 rows see and sits out the
// rest of its tile's turns (forward_consumer.cuh): after its last block (a causal diagonal,
// with 192-row tiles or key blocks narrower than 128) and before its first (a window). The
// table must reach each of these.
TEST(Sm90TileChoice, SharedTableRunsWarpgroupsOverPartOfTheirTilesKeys) {
  bool tall_tile_skips_last = false, narrow_blocks_skip_last = false, skips_first = false;
  for (const Case& c : shared_cases(TableFor::cuda)) {
    const int d = c.head_dim;
    const bool sm90_head_dim = d == 64 || d == 96 || d == 128 || d == 192 || d == 256;
    if (c.varlen() || !sm90_head_dim) continue;
    const int rows = rows_for(c);
    for (int row0 = 0; row0 < c.seqlen_q; row0 += rows) {
      const int last = std::min(row0 + rows, c.seqlen_q) - 1;
      const cuda::KeyTileRange tile = key_blocks(c, row0, last);
      if (tile.empty()) continue;
      for (int first = row0; first <= last; first += 64) {
        const cuda::KeyTileRange mine = key_blocks(c, first, std::min(first + 63, last));
        if (mine.empty()) continue;
        if (mine.end < tile.end) (rows == 192 ? tall_tile_skips_last : narrow_blocks_skip_last) = true;
        if (mine.begin > tile.begin) skips_first = true;
      }
    }
  }
  EXPECT_TRUE(tall_tile_skips_last) << "no 192-row tile has a warpgroup that sees fewer key blocks than its tile";
  EXPECT_TRUE(narrow_blocks_skip_last) << "no 128-row tile has a warpgroup that sees fewer key blocks than its tile";
  EXPECT_TRUE(skips_first) << "no tile has a warpgroup whose first key block comes after its tile's";
}

// The tile order's sections: (batch, head) pairs whose K/V fill an eighth of L2
// without a mask (so that a head's tiles run close together and read its K/V from DRAM once),
// half with one (enough long and short tiles for the longest-first order to balance).
TEST(TileOrder, SectionsTakeAnEighthOfL2WithoutAMaskAndHalfWithOne) {
  const long long l2 = 50LL << 20;                      // H100
  const long long kv_8k = cuda::TileOrder::kv_bytes_per_head(8192, 128, 2, 1);  // d = 128, n = 8k: 4 MB
  EXPECT_EQ(kv_8k, 4LL << 20);
  EXPECT_EQ(cuda::TileOrder::kv_bytes_per_head(8192, 128, 2, 8), kv_8k / 8);  // a GQA group of 8
  const int ctas = 132;
  EXPECT_EQ(cuda::TileOrder::make(64, 16, 2, kv_8k, l2, false, ctas).section_heads, 1);
  EXPECT_EQ(cuda::TileOrder::make(64, 16, 2, kv_8k, l2, true, ctas).section_heads, 6);
  EXPECT_EQ(cuda::TileOrder::make(8, 16, 16, kv_8k / 8, l2, false, ctas).section_heads, 12);
  EXPECT_EQ(cuda::TileOrder::make(8, 16, 16, kv_8k / 8, l2, true, ctas).section_heads, 50);
  // A head larger than the budget: one per section; more budget than pairs: all of them.
  EXPECT_EQ(cuda::TileOrder::make(4, 3, 1, l2, l2, false, ctas).section_heads, 1);
  EXPECT_EQ(cuda::TileOrder::make(4, 3, 1, 1024, l2, true, ctas).section_heads, 3);
}

// The partial section comes first; with a mask the last section holds at least 3 tiles per CTA,
// so that the tiles claimed last are the short ones of a longest-first order (a short last
// section ended the kernel on a few long tiles while the other CTAs idled).
TEST(TileOrder, PartialSectionFirstAndALastSectionOfThreeTilesPerCtaWithAMask) {
  const long long l2 = 50LL << 20;
  const long long kv_1k = 2LL * 1024 * 256 * 2;  // d = 256, n = 1k: 1 MB per head, 25 per section
  const auto masked = cuda::TileOrder::make(8, 8, 16, kv_1k, l2, true, 132);
  EXPECT_EQ(masked.section_heads, 25);
  EXPECT_EQ(masked.last_heads, 50);  // 3 x 132 tiles of 8 query blocks: 49.5 pairs
  EXPECT_EQ(masked.lead_heads, (128 - 50) % 25);
  const auto unmasked = cuda::TileOrder::make(8, 8, 16, kv_1k, l2, false, 132);
  EXPECT_EQ(unmasked.section_heads, 6);
  EXPECT_EQ(unmasked.last_heads, 6);
  EXPECT_EQ(unmasked.lead_heads, 128 % 6);
  // No more K/V in the last section than L2 holds: d = 256, n = 16k (16 MB per head) would want
  // 4 pairs for 3 x 132 tiles of 128 query blocks; 3 fit.
  const auto capped = cuda::TileOrder::make(128, 8, 1, 16LL << 20, l2, true, 132);
  EXPECT_EQ(capped.section_heads, 1);
  EXPECT_EQ(capped.last_heads, 3);
  EXPECT_EQ(capped.lead_heads, 0);
  // An empty batch: nothing to order, and nothing divided by zero.
  EXPECT_EQ(cuda::TileOrder::make(8, 8, 0, kv_1k, l2, true, 132).num_tiles(), 0);
  // Fewer pairs than the last section wants: one section of all of them.
  const auto small = cuda::TileOrder::make(8, 4, 2, kv_1k, l2, true, 132);
  EXPECT_EQ(small.last_heads, 8);
  EXPECT_EQ(small.lead_heads, 0);
}

TEST(TileOrder, VisitsEveryTileOnceLongestQueryBlocksFirstInASection) {
  for (bool masked : {false, true}) {
    for (int ctas : {1, 30}) {
      // 7 query blocks, 5 heads, 3 batches; K/V sized so that sections hold 2 or 8 pairs, so the
      // first section is partial; with 30 CTAs and a mask the last takes 13 pairs (3 tiles per CTA).
      const auto s = cuda::TileOrder::make(7, 5, 3, (50LL << 20) / 16, 50LL << 20, masked, ctas);
      ASSERT_EQ(s.section_heads, masked ? 8 : 2);
      ASSERT_EQ(s.num_tiles(), 7 * 5 * 3);
      // The section of each (batch, head) pair, from the layout the order states.
      auto section_of = [&](int pair) {
        if (pair < s.lead_heads) return 0;
        if (pair >= 15 - s.last_heads) return 1000;
        return 1 + (pair - s.lead_heads) / s.section_heads;
      };
      std::set<std::tuple<int, int, int>> seen;
      int previous_section = -1, previous_m = 0;
      for (int i = 0; i < s.num_tiles(); ++i) {
        const cuda::TileCoord t = s.tile(i);
        ASSERT_TRUE(t.m_block >= 0 && t.m_block < 7 && t.head >= 0 && t.head < 5 && t.batch >= 0 && t.batch < 3);
        EXPECT_TRUE(seen.insert({t.m_block, t.head, t.batch}).second) << "tile " << i << " repeats";
        const int section = section_of(t.batch * 5 + t.head);
        EXPECT_GE(section, previous_section) << "tile " << i << " goes back to an earlier section";
        if (section == previous_section) EXPECT_LE(t.m_block, previous_m) << "tile " << i;
        previous_section = section;
        previous_m = t.m_block;
      }
      EXPECT_EQ(int(seen.size()), 7 * 5 * 3);
      if (masked) EXPECT_GE(s.last_heads * 7, 3 * ctas);
    }
  }
}

// The last partial wave's key blocks dealt out to units: every block of every tail tile in
// exactly one segment, units of nearly equal length and at most two segments each, and the
// slots that a tile's merge reads are those its segments wrote.
TEST(TailSplit, DealsEveryTailBlockOnceInNearlyEqualUnits) {
  struct Shape {
    long long tiles;
    int ctas, blocks;
  };
  for (const Shape& sh : {Shape{2048, 132, 32}, Shape{144, 132, 10}, Shape{288, 132, 12}, Shape{2048, 132, 128}, Shape{133, 132, 9},
                          Shape{1000, 132, 64}}) {
    const auto t = cuda::TailSplit::make(sh.tiles, sh.ctas, sh.blocks, true);
    ASSERT_TRUE(t.active()) << sh.tiles << " tiles";
    const int rest = int(sh.tiles % sh.ctas);
    EXPECT_EQ(t.first_tile, sh.tiles - rest);
    EXPECT_EQ(t.tiles(), rest);
    EXPECT_EQ(t.units, std::min(sh.ctas, rest * sh.blocks));
    std::vector<int> owner(size_t(rest) * sh.blocks, -1);  // the slot that computes each block
    int shortest = 1 << 30, longest = 0;
    for (int u = 0; u < t.units; ++u) {
      ASSERT_TRUE(t.segments(u) == 1 || t.segments(u) == 2) << "unit " << u;
      int length = 0;
      for (int s = 0; s < t.segments(u); ++s) {
        int begin, end;
        t.segment_blocks(u, s, begin, end);
        ASSERT_TRUE(0 <= begin && begin < end && end <= sh.blocks) << "unit " << u << " segment " << s;
        const int tile = t.segment_tile(u, s);
        for (int b = begin; b < end; ++b) {
          EXPECT_EQ(owner[size_t(tile) * sh.blocks + b], -1) << "block " << b << " of tail tile " << tile << " twice";
          owner[size_t(tile) * sh.blocks + b] = cuda::TailSplit::slot(u, s);
        }
        length += end - begin;
      }
      shortest = std::min(shortest, length);
      longest = std::max(longest, length);
    }
    EXPECT_LE(longest - shortest, 1);
    EXPECT_LT(longest, sh.blocks);
    for (int tile = 0; tile < rest; ++tile) {
      std::set<int> written, read;
      for (int b = 0; b < sh.blocks; ++b) {
        ASSERT_NE(owner[size_t(tile) * sh.blocks + b], -1) << "block " << b << " of tail tile " << tile << " unassigned";
        written.insert(owner[size_t(tile) * sh.blocks + b]);
      }
      for (int u = t.first_unit(tile); u <= t.last_unit(tile); ++u) read.insert(t.slot_in_tile(u, tile));
      EXPECT_EQ(written, read) << "tail tile " << tile;
      EXPECT_GE(written.size(), 2u) << "tail tile " << tile << " is not split";
    }
  }
}

// Not split: a mask or varlen (tiles of different lengths), no partial wave, a last wave that
// is nearly full, or units that would save fewer than 8 key blocks.
TEST(TailSplit, OnlyWhereItShortensTheLastWaveBy8KeyBlocks) {
  EXPECT_FALSE(cuda::TailSplit::make(2048, 132, 32, false).active());
  EXPECT_FALSE(cuda::TailSplit::make(2112, 132, 32, true).active());   // 16 full waves
  EXPECT_FALSE(cuda::TailSplit::make(100, 132, 32, true).active());    // one wave, not full
  EXPECT_FALSE(cuda::TailSplit::make(2110, 132, 32, true).active());   // 130 of 132: saves 0 blocks
  EXPECT_FALSE(cuda::TailSplit::make(2048, 132, 16, true).active());   // d = 128 n = 2k: saves 7
  EXPECT_TRUE(cuda::TailSplit::make(2048, 132, 32, true).active());    // d = 128 n = 4k: saves 15
  EXPECT_EQ(cuda::TailSplit::make(2048, 132, 32, false).num_items(), 2048);
  EXPECT_EQ(cuda::TailSplit::make(2048, 132, 32, true).num_items(), 1980 + 132);
}

TEST(Sm80TileChoice, ShortPrefillTilesOnlyAtHeadDim256ShortUnpackedQueries) {
  using cuda::sm80::short_prefill_tiles;
  EXPECT_TRUE(short_prefill_tiles(256, 1, 1));
  EXPECT_TRUE(short_prefill_tiles(256, 1024, 1));
  EXPECT_FALSE(short_prefill_tiles(256, 1025, 1));
  EXPECT_FALSE(short_prefill_tiles(256, 40, 4));  // GQA heads packed into rows
  EXPECT_FALSE(short_prefill_tiles(192, 1000, 1));
  EXPECT_FALSE(short_prefill_tiles(128, 200, 1));
}

TEST(Sm80TileChoice, SharedTableRunsBothPrefillTilesAtHeadDim256) {
  bool short_tiles = false, tall_tiles = false;
  for (const Case& c : shared_cases(TableFor::cuda)) {
    // Up to 64 query rows: the decode path, or packed heads; above, heads are never packed.
    if (c.head_dim != 256 || c.seqlen_q <= 64) continue;
    (cuda::sm80::short_prefill_tiles(c.head_dim, c.seqlen_q, 1) ? short_tiles : tall_tiles) = true;
  }
  EXPECT_TRUE(short_tiles) << "no d = 256 case runs the short prefill tile";
  EXPECT_TRUE(tall_tiles) << "no d = 256 case runs the 128 x 64 prefill tile";
}

// A KV-cache call's append + rotary runs inside the decode kernel for up to 16 new rows on the
// decode tile, in a kernel of its own before the attention otherwise; the KV case table reaches
// both (on the sm80 family, which decodes on Hopper too).
TEST(Sm80TileChoice, KvAppendFusedOnTheDecodeTileForFewNewRows) {
  using cuda::sm80::fuses_kv_append;
  int storage = 0;
  auto problem = [](int batch, int heads_q, int heads_kv, int head_dim, int seqlen_q) {
    detail::ForwardProblem p;
    p.batch = batch;
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.head_dim = head_dim;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = 4096;
    return p;
  };
  auto append = [&](int seqlen_new, bool rotary) {
    detail::KvAppend a;
    a.seqlen_new = seqlen_new;
    a.k_new.data = a.v_new.data = seqlen_new > 0 ? &storage : nullptr;
    a.cos = a.sin = rotary ? &storage : nullptr;
    return a;
  };
  EXPECT_TRUE(fuses_kv_append(problem(8, 32, 8, 128, 1), 128, append(1, true)));
  EXPECT_TRUE(fuses_kv_append(problem(8, 32, 8, 128, 4), 128, append(4, false)));
  EXPECT_TRUE(fuses_kv_append(problem(8, 32, 8, 128, 1), 128, append(16, true)));
  EXPECT_FALSE(fuses_kv_append(problem(8, 32, 8, 128, 1), 128, append(17, true)));
  EXPECT_FALSE(fuses_kv_append(problem(8, 32, 8, 128, 1), 128, append(0, false)));  // nothing to do
  EXPECT_FALSE(fuses_kv_append(problem(8, 32, 8, 128, 32), 128, append(16, true)));  // 4 x 32 rows: prefill tile
  EXPECT_FALSE(fuses_kv_append(problem(0, 32, 8, 128, 1), 128, append(1, true)));   // no kernel launched
  EXPECT_FALSE(fuses_kv_append(problem(8, 32, 8, 128, 0), 128, append(1, true)));
  detail::ForwardProblem dropout = problem(8, 32, 8, 128, 1);
  dropout.dropout.p = 0.1f;
  EXPECT_FALSE(fuses_kv_append(dropout, 128, append(1, true)));

  int fused = 0, separate = 0;
  for (const KvCase& c : kv_cases()) {
    if (c.seqlen_new == 0 && c.rotary_dim == 0) continue;
    int width = 32;
    for (int w : {32, 64, 96, 128, 192, 256})
      if (w >= c.head_dim) {
        width = w;
        break;
      }
    (fuses_kv_append(problem(c.batch, c.heads_q, c.heads_kv, c.head_dim, c.seqlen_q), width,
                     append(c.seqlen_new, c.rotary_dim > 0))
         ? fused
         : separate)++;
  }
  EXPECT_GE(fused, 8) << "KV case rows whose append the decode kernel does";
  EXPECT_GE(separate, 3) << "KV case rows whose append runs as a kernel of its own";
}

// Every tile once; each column's key blocks first to last (deterministic mode: last to first),
// claimed min(interleave, the group's columns) apart (the last group may be narrower).
TEST(Sm90BackwardClaimOrder, EveryTileOnceKeyBlocksInOrderColumnsInterleaved) {
  using cuda::sm90::BackwardClaimOrder;
  for (int n_blocks : {1, 3, 16}) {
    for (int columns : {1, 5, 15, 16, 17}) {
      for (int interleave : {1, 4, 16}) {
        for (bool last_to_first : {false, true}) {
          const BackwardClaimOrder order{n_blocks, columns, interleave, last_to_first};
          std::vector<std::vector<int>> claims(columns);  // per column: claim indices in order
          std::set<std::pair<int, int>> seen;
          for (int index = 0; index < n_blocks * columns; ++index) {
            const auto p = order.at(index);
            ASSERT_GE(p.n_block, 0);
            ASSERT_LT(p.n_block, n_blocks);
            ASSERT_GE(p.column, 0);
            ASSERT_LT(p.column, columns);
            EXPECT_TRUE(seen.insert({p.column, p.n_block}).second) << "index " << index;
            claims[p.column].push_back(index);
            const int position = int(claims[p.column].size()) - 1;
            EXPECT_EQ(p.n_block, last_to_first ? n_blocks - 1 - position : position)
                << "n_blocks " << n_blocks << ", columns " << columns << ", interleave " << interleave;
          }
          for (int c = 0; c < columns; ++c) {
            const int group_columns = std::min(interleave, columns - c / interleave * interleave);
            for (std::size_t i = 1; i < claims[c].size(); ++i) EXPECT_EQ(claims[c][i] - claims[c][i - 1], group_columns);
          }
        }
      }
    }
  }
  // 132 CTAs, 50 MB of L2. n = 2k (32 steps): 5 tiles of a column at once -> 27 columns, as
  // many as fit (d = 64: 1 MB each; d = 128: 2 MB, 12 fit).
  const long long l2 = 50LL << 20;
  EXPECT_EQ(BackwardClaimOrder::deterministic_interleave(132, 32, 1LL << 20, l2), 25);
  EXPECT_EQ(BackwardClaimOrder::deterministic_interleave(132, 32, 2LL << 20, l2), 12);
  EXPECT_EQ(BackwardClaimOrder::deterministic_interleave(132, 32, 1LL << 10, l2), 27);
  EXPECT_EQ(BackwardClaimOrder::deterministic_interleave(132, 1024, 1LL << 10, l2), 2);
  EXPECT_EQ(BackwardClaimOrder::deterministic_interleave(132, 0, 0, l2), 132);
  EXPECT_EQ(BackwardClaimOrder::deterministic_interleave(132, 32, l2, l2), 1);  // none fits: 1
}

// The default mode takes one column at a time, and under a mask all columns in turn when the
// tiles fill at most four waves (GQA 16/4, d = 128: n = 2k, b = 4, 2 splits -> 512 tiles).
TEST(Sm90BackwardClaimOrder, DefaultInterleavesAllColumnsOnlyUnderAMaskWithFewTiles) {
  using cuda::sm90::BackwardClaimOrder;
  EXPECT_EQ(BackwardClaimOrder::default_interleave(true, 32, 512, 132), 32);
  EXPECT_EQ(BackwardClaimOrder::default_interleave(true, 32, 528, 132), 32);
  EXPECT_EQ(BackwardClaimOrder::default_interleave(true, 33, 529, 132), 1);
  EXPECT_EQ(BackwardClaimOrder::default_interleave(true, 128, 2048, 132), 1);  // MHA d = 128, n = 2k, b = 8
  EXPECT_EQ(BackwardClaimOrder::default_interleave(false, 32, 512, 132), 1);
  EXPECT_EQ(BackwardClaimOrder::default_interleave(true, 0, 0, 132), 1);
}

// GQA without a mask: the fewest splits whose waves of equally long tiles hold the fewest steps.
TEST(Sm90BackwardHeadSplits, UnmaskedFewestSplitsWithTheShortestWaves) {
  using cuda::sm90::unmasked_head_splits;
  EXPECT_EQ(unmasked_head_splits(4, 256, 132), 1);  // 2 waves of 4 heads; 2 splits: 4 waves of 2
  EXPECT_EQ(unmasked_head_splits(4, 64, 132), 2);   // 1 wave of 4 heads; 2 splits: 1 wave of 2
  EXPECT_EQ(unmasked_head_splits(4, 140, 132), 4);  // 2 waves of 4 heads; 2: 3 waves of 2; 4: 5 of 1
  EXPECT_EQ(unmasked_head_splits(8, 16, 132), 8);   // 1 wave each, the fewest heads a tile
  EXPECT_EQ(unmasked_head_splits(1, 16, 132), 1);   // no GQA
  EXPECT_EQ(unmasked_head_splits(6, 100, 132), 6);  // 1 wave of 6 heads; 6 splits: 5 waves of 1
  EXPECT_EQ(unmasked_head_splits(6, 132, 132), 1);  // 1 wave of 6 heads; every split as long
}

// Which per-sequence key ranges the sm90 forward takes (sm90/api.hpp: supports_kv): paged K/V
// with aligned pools, nothing it would read past a sequence without zeroing.
TEST(Sm90Forward, TakesPagedKv) {
  static const std::int32_t table[4] = {0, 1, 2, 3};
  static const std::int32_t lengths[1] = {5};
  detail::ForwardProblem p;
  p.dtype = DType::bf16;
  p.heads_kv = 2;
  EXPECT_TRUE(cuda::sm90::supports_kv(p));  // no key ranges at all
  alignas(16) static std::uint16_t pool[16];
  const detail::SeqTensor aligned{pool, 16 * 2 * 64, 2 * 64, 64};  // (pages, 16 rows, 2 heads, 64)
  p.k = p.v = aligned;
  p.kv.seqused_k = lengths;
  EXPECT_FALSE(cuda::sm90::supports_kv(p));  // seqused_k over contiguous K/V
  p.kv.pages = {table, 4, 16, 4, 10};
  EXPECT_TRUE(cuda::sm90::supports_kv(p));
  detail::ForwardProblem q = p;
  q.kv.k_start = lengths;  // cache_leftpad
  EXPECT_FALSE(cuda::sm90::supports_kv(q));
  q = p;
  q.kv.batch_index = lengths;  // cache_batch_idx
  EXPECT_FALSE(cuda::sm90::supports_kv(q));
  q = p;
  q.dropout.p = 0.1f;
  EXPECT_FALSE(cuda::sm90::supports_kv(q));
  q = p;
  q.v.seq_stride = 2 * 64 + 4;  // rows 264 bytes apart: not TMA's 16-byte multiple
  EXPECT_FALSE(cuda::sm90::supports_kv(q));
  q = p;
  q.k.data = reinterpret_cast<char*>(pool) + 2;
  EXPECT_FALSE(cuda::sm90::supports_kv(q));
}

}  // namespace
}  // namespace flashattn::testing
