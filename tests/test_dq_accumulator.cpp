// The sm80 backward's fp32 dQ accumulator addressing (cuda/sm80/backward_params.cuh), on the
// host: every (sequence, row, head, column) the main kernel adds to, padded rows of a query
// block included, lies inside the allocation and belongs to no other sequence; 8 x 8 blocks are
// contiguous, as the kernel's atomics and the conversion kernel assume.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/sm80/backward_params.cuh"

namespace flashattn::testing {
namespace {

using cuda::sm80::BackwardParams;
constexpr int kB = BackwardParams::kDqBlock;

// Params for a varlen batch of these query lengths (fixed-length batches are the case of equal
// lengths), as backward_launch.cuh fills them for a kernel of block_m query rows.
BackwardParams params_for(const std::vector<int>& lengths, int heads, int block_m) {
  BackwardParams p;
  p.batch = int(lengths.size());
  p.heads_q = heads;
  p.seqlen_q = *std::max_element(lengths.begin(), lengths.end());
  p.dense_rows_q = std::int64_t(p.batch) * p.seqlen_q;
  p.dq_pad_rows = BackwardParams::dq_pad_rows_for(block_m);
  return p;
}

void check_layout(const std::vector<int>& lengths, int heads, int head_dim, int block_m) {
  SCOPED_TRACE(::testing::Message() << "heads " << heads << " head_dim " << head_dim << " block_m " << block_m
                                    << " sequences " << lengths.size() << " first length " << lengths[0]);
  const BackwardParams p = params_for(lengths, heads, block_m);
  const std::int64_t size = p.dq_accum_elements(head_dim);
  std::vector<int> owner(size_t(size), -1);
  std::int64_t dense_q = 0;  // cu_seqlens_q[b]
  for (int b = 0; b < p.batch; ++b) {
    const int rows = (lengths[b] + block_m - 1) / block_m * block_m;  // whole query blocks
    for (int row = 0; row < rows; ++row) {
      const std::int64_t acc_row = p.dq_accum_row(b, dense_q, row);
      if (row == 0) ASSERT_EQ(acc_row % kB, 0) << "sequence " << b << " does not start a row group";
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < head_dim; ++c) {
          const std::int64_t at = p.dq_accum_offset(acc_row, h, c, head_dim);
          ASSERT_GE(at, 0);
          ASSERT_LT(at, size) << "sequence " << b << " row " << row;
          ASSERT_EQ(owner[size_t(at)], -1) << "sequence " << b << " row " << row << " overlaps sequence "
                                           << owner[size_t(at)];
          owner[size_t(at)] = b;
        }
    }
    dense_q += lengths[b];
  }
  // An aligned kB x kB block is kB * kB consecutive floats, row-major; row groups are
  // group_stride apart.
  for (int h = 0; h < heads; ++h)
    for (int c0 = 0; c0 < head_dim; c0 += kB) {
      const std::int64_t base = p.dq_accum_offset(kB, h, c0, head_dim);
      for (int i = 0; i < kB; ++i)
        for (int j = 0; j < kB; ++j) ASSERT_EQ(p.dq_accum_offset(kB + i, h, c0 + j, head_dim), base + i * kB + j);
      ASSERT_EQ(p.dq_accum_offset(2 * kB, h, c0, head_dim) - base, p.dq_accum_group_stride(head_dim));
    }
}

TEST(Sm80DqAccumulator, SequencesStayInsideTheirRowsAndTheAllocation) {
  for (int block_m : {64, 128})
    for (int head_dim : {32, 96, 256}) {
      check_layout({200, 200, 200}, 2, head_dim, block_m);             // fixed length, not a multiple of 8
      check_layout({1, 7, 9, 64, 65, 0, 130, 3}, 3, head_dim, block_m);  // varlen: odd starts, an empty one
    }
}

}  // namespace
}  // namespace flashattn::testing
