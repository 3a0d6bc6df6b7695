#include "cpu/kv_append.hpp"

#include <vector>

#include "cpu/access.hpp"

namespace flashattn::cpu {
namespace {

// Loads one row of head_dim values, rotates its first rotary_dim at `position`, and stores it.
void copy_row(DType dtype, const detail::KvAppend& a, const void* src, std::int64_t src_index, void* dst,
              std::int64_t dst_index, int head_dim, int position, bool rotate, std::vector<float>& row) {
  for (int d = 0; d < head_dim; ++d) row[d] = load(dtype, src, src_index + d);
  if (rotate)
    detail::rotate_pairs(row.data(), a.rotary_dim, a.interleaved, [&](int j, float& c, float& s) {
      c = load(dtype, a.cos, position * a.cos_stride + j);
      s = load(dtype, a.sin, position * a.sin_stride + j);
    });
  for (int d = 0; d < head_dim; ++d) store(dtype, dst, dst_index + d, row[d]);
}

}  // namespace

void append_kv(const detail::ForwardProblem& p, const detail::KvAppend& a) {
  if (!a.appends()) return;
  std::vector<float> row(p.head_dim);
  for (int b = 0; b < p.batch; ++b) {
    const int kv_batch = p.kv.batch_index ? p.kv.batch_index[b] : b;
    for (int i = 0; i < a.seqlen_new; ++i) {
      const int position = a.cache_seqlens[b] + i;
      for (int h = 0; h < p.heads_kv; ++h) {
        const std::int64_t kd = detail::kv_element(p.kv.pages, p.k.batch_stride, p.k.seq_stride, p.k.head_stride,
                                                   b, kv_batch, position, h);
        const std::int64_t vd = detail::kv_element(p.kv.pages, p.v.batch_stride, p.v.seq_stride, p.v.head_stride,
                                                   b, kv_batch, position, h);
        copy_row(p.dtype, a, a.k_new.data, row_index(a.k_new, b, 0, i, h), p.k.data, kd, p.head_dim, position,
                 a.rotates(), row);
        copy_row(p.dtype, a, a.v_new.data, row_index(a.v_new, b, 0, i, h), p.v.data, vd, p.head_dim, position,
                 false, row);
      }
    }
  }
}

void rotate_queries(const detail::ForwardProblem& p, const detail::KvAppend& a, void* dst) {
  std::vector<float> row(p.head_dim);
  const detail::SeqTensor out{dst, std::int64_t(p.seqlen_q) * p.heads_q * p.head_dim,
                              std::int64_t(p.heads_q) * p.head_dim, p.head_dim};
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.seqlen_q; ++i)
      for (int h = 0; h < p.heads_q; ++h)
        copy_row(p.dtype, a, p.q.data, row_index(p.q, b, 0, i, h), dst, row_index(out, b, 0, i, h), p.head_dim,
                 a.query_position(b, i), true, row);
}

}  // namespace flashattn::cpu
