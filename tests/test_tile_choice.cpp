// Tile choices made on the host, and that the shared case table reaches each of them with
// enough tiles to run several per CTA (so a wrong choice or a broken tile shape shows up in
// the GPU suite, not only in benchmarks).
#include <gtest/gtest.h>

#include "cuda/sm80/forward_heuristics.hpp"
#include "cuda/sm90/forward_heuristics.hpp"
#include "support/cases.hpp"

namespace flashattn::testing {
namespace {

using cuda::sm90::query_block_rows;

TEST(Sm90TileChoice, TallTilesOnlyAtSmallHeadDimsAndLittlePadding) {
  EXPECT_EQ(query_block_rows(128, 4096), 128);
  EXPECT_EQ(query_block_rows(256, 192), 128);
  EXPECT_EQ(query_block_rows(64, 1), 128);       // 192 rows for 1 vs 128
  EXPECT_EQ(query_block_rows(64, 1024), 128);    // 1152 rows vs 1024: 12.5% more
  EXPECT_EQ(query_block_rows(64, 2048), 192);    // 2112 vs 2048: 3% more
  EXPECT_EQ(query_block_rows(64, 16384), 192);
  EXPECT_EQ(query_block_rows(64, 129), 192);     // 192 vs 256
  EXPECT_EQ(query_block_rows(64, 576), 192);     // 576 vs 640: no padding at all
}

long long tiles(const Case& c, int rows) {
  return (c.seqlen_q + rows - 1) / rows * (long long)c.heads_q * c.batch;
}

TEST(Sm90TileChoice, SharedTableRunsEveryTileHeightOverManyTiles) {
  constexpr int kSms = 132;  // H100 SXM / H200
  bool tall = false, regular = false;
  for (const Case& c : shared_cases(TableFor::cuda)) {
    if (c.varlen() || c.head_dim % 16 != 0 || c.head_dim > 256) continue;
    const int rows = query_block_rows(c.head_dim, c.seqlen_q);
    if (tiles(c, rows) <= kSms) continue;
    (rows == 192 ? tall : regular) = true;
  }
  EXPECT_TRUE(tall) << "no case runs 192-row tiles several per CTA";
  EXPECT_TRUE(regular) << "no case runs 128-row tiles several per CTA";
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

}  // namespace
}  // namespace flashattn::testing
