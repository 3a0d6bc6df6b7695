// quantize_e4m3 on the CPU (flashattn/fp8.hpp): the same operations, in the same order, as the
// CUDA kernels (cuda/quantize.cu), so that both give the same bits: the signs, the butterflies
// (lower + upper, lower - upper, pairs at distance 1, 2, 4, ...), the scale 1 / sqrt(d), then
// x / descale rounded to nearest even and saturated at 448.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/numeric.hpp"
#include "cpu/access.hpp"
#include "cpu/backend.hpp"

namespace flashattn::cpu {
namespace {

// Row (b, s, h) of x as floats, transformed when the problem has signs.
void load_row(const detail::QuantizeProblem& p, int b, int s, int h, std::vector<float>& row) {
  const std::int64_t base = b * p.x_batch_stride + s * p.x_seq_stride + h * p.x_head_stride;
  for (int d = 0; d < p.head_dim; ++d) row[d] = load(p.dtype, p.x, base + d);
  if (p.signs == nullptr) return;
  for (int d = 0; d < p.head_dim; ++d) row[d] *= p.signs[d];
  for (int half = 1; half < p.head_dim; half *= 2)
    for (int d = 0; d < p.head_dim; ++d)
      if ((d & half) == 0) {
        const float lower = row[d], upper = row[d + half];
        row[d] = lower + upper;
        row[d + half] = lower - upper;
      }
  for (int d = 0; d < p.head_dim; ++d) row[d] *= p.transform_scale;
}

}  // namespace

void quantize_e4m3(const detail::QuantizeProblem& p) {
  std::vector<float> amax(std::size_t(p.slots()), 0.0f), row(std::size_t(p.head_dim));
  for (int b = 0; b < p.batch; ++b)
    for (int s = 0; s < p.seqlen; ++s)
      for (int h = 0; h < p.heads; ++h) {
        load_row(p, b, s, h, row);
        float& m = amax[std::size_t(p.slot(b, s, h))];
        for (float v : row) m = std::max(m, std::fabs(v));
      }
  for (int i = 0; i < p.slots(); ++i)
    p.descale[p.descale_offset(i)] = std::max(amax[std::size_t(i)] / detail::kE4m3Max, detail::kMinDescale);
  for (int b = 0; b < p.batch; ++b)
    for (int s = 0; s < p.seqlen; ++s)
      for (int h = 0; h < p.heads; ++h) {
        load_row(p, b, s, h, row);
        const float descale = p.descale[p.descale_offset(p.slot(b, s, h))];
        std::uint8_t* out = p.out + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride;
        for (int d = 0; d < p.head_dim; ++d) out[d] = detail::float_to_e4m3(row[d] / descale);
      }
}

}  // namespace flashattn::cpu
