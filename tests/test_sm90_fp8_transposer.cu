// The FP8 in-kernel V^T transposer's addresses (src/cuda/sm90/fp8_value_transposer.cuh), on the
// host: a unit's offsets in V's row stages and in the V^T stages are the XOR of a lane's part, the
// unit's key part and its dim part, plus the stage's. The kernel checks a sample of units at compile
// time (transposer_addresses_hold) and takes the pre-pass where the check fails; here every unit of
// every FP8 stage shape is checked and must agree with the sample.
#include <gtest/gtest.h>

#include <cutlass/numeric_types.h>

#include "cuda/sm90/forward_traits.cuh"
#include "cuda/sm90/fp8_value_transposer.cuh"

namespace flashattn::testing {
namespace {

using namespace cuda::sm90;

// Every unit of two stages, every lane's row and 16-byte piece of it.
template <class Layout>
bool every_offset_is_xor_of_parts(Layout layout, int rows, int cols, int row_step, int col_step, int row_part,
                                  int col_part) {
  for (int stage = 0; stage < 2; ++stage)
    for (int r0 = 0; r0 < rows; r0 += row_step)
      for (int c0 = 0; c0 < cols; c0 += col_step)
        for (int r = 0; r < row_part; ++r)
          for (int c = 0; c < col_part; c += 16)
            if (int(layout(r0 + r, c0 + c, stage)) !=
                int(layout(0, 0, stage)) + (int(layout(r, c, 0)) ^ int(layout(r0, 0, 0)) ^ int(layout(0, c0, 0))))
              return false;
  return true;
}

template <int kHeadDim, int kRows>
void expect_sample_agrees() {
  using Traits = ForwardTraits<cutlass::float_e4m3_t, kHeadDim, kRows, cutlass::bfloat16_t, false, true>;
  const bool every = every_offset_is_xor_of_parts(typename Traits::SmemLayoutV{}, Traits::kBlockN, kHeadDim,
                                                  kTransposeUnitKeys, kTransposeUnitDims, kTransposeUnitKeys,
                                                  kTransposeUnitDims) &&
                     every_offset_is_xor_of_parts(typename Traits::SmemLayoutVt{}, kHeadDim, Traits::kBlockN,
                                                  kTransposeUnitDims, kTransposeUnitKeys, kTransposeUnitDims, 1);
  EXPECT_EQ(every, transposer_addresses_hold<Traits>()) << "head dim " << kHeadDim << ", " << kRows << "-row tiles";
}

TEST(Sm90Fp8Transposer, CompileTimeSampleAgreesWithEveryUnit) {
  expect_sample_agrees<32, 128>();
  expect_sample_agrees<32, 192>();
  expect_sample_agrees<64, 128>();
  expect_sample_agrees<64, 192>();
  expect_sample_agrees<96, 128>();
  expect_sample_agrees<96, 192>();
  expect_sample_agrees<128, 128>();
  expect_sample_agrees<128, 192>();
  expect_sample_agrees<192, 128>();
  expect_sample_agrees<256, 128>();
}

// Where the transposer runs: every FP8 stage shape but head dim 96 on 128-row tiles (192-key
// blocks of 32-byte swizzle atoms, whose unit parts share bits), which keeps the pre-pass.
TEST(Sm90Fp8Transposer, AddressesHoldOnEveryStageShapeButOne) {
  using Hd96 = ForwardTraits<cutlass::float_e4m3_t, 96, 128, cutlass::bfloat16_t, false, true>;
  EXPECT_FALSE(transposer_addresses_hold<Hd96>());
  using Hd128 = ForwardTraits<cutlass::float_e4m3_t, 128, 128, cutlass::bfloat16_t, false, true>;
  EXPECT_TRUE(transposer_addresses_hold<Hd128>());
  using Hd256 = ForwardTraits<cutlass::float_e4m3_t, 256, 128, cutlass::bfloat16_t, false, true>;
  EXPECT_TRUE(transposer_addresses_hold<Hd256>());
}

}  // namespace
}  // namespace flashattn::testing
