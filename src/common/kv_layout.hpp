#pragma once
// Where the keys and values of a sequence come from: the one place that maps (sequence, key
// row, KV head) to an element of K or V, for contiguous and for paged storage. Every loader
// (the CPU backend, the reference, GPU kernels) asks it; nothing else knows about pages.
//
// Contiguous: K is (batch, seq, heads_kv, dim) (or packed (total, heads_kv, dim) with
// cu_seqlens); key row r of sequence b is storage row offset_k + r of K/V batch kv_batch.
// Paged: K is (num_blocks, page_size, heads_kv, dim) and block_table (batch, max_blocks) names
// the page holding rows [i * page_size, (i + 1) * page_size) of sequence b; key row r of
// sequence b is storage row offset_k + r of that sequence's pages.
//
// Per-sequence overrides (all optional, int32, batch entries, in the tensors' memory):
//   seqused_k     the sequence's keys end at storage row seqused_k[b] (KV cache: cache_seqlens
//                 plus the appended rows; varlen: flash-attn's seqused_k),
//   k_start       its keys start at storage row k_start[b] (KV cache: cache_leftpad),
//   batch_index   its K/V live in batch batch_index[b] of a contiguous cache (cache_batch_idx);
// and `appended`: rows this call appended after seqused_k[b] (KV cache: seqlen of k_new), so
// that the keys end at seqused_k[b] + appended without a per-call array.
#include <cstdint>

#include "common/host_device.hpp"

namespace flashattn::detail {

struct KvPages {
  const std::int32_t* block_table = nullptr;  // null: contiguous storage
  std::int64_t table_stride = 0;              // elements between the rows of block_table
  int page_size = 0;                          // keys per page: a multiple of 16, 16 to 512
  int max_blocks = 0;                         // columns of block_table
  int num_pages = 0;                          // pages in the pool (K's and V's first extent)
};

struct KvMap {
  KvPages pages;
  const std::int32_t* seqused_k = nullptr;
  const std::int32_t* k_start = nullptr;
  const std::int32_t* batch_index = nullptr;
  int appended = 0;

  FA_HOST_DEVICE bool paged() const { return pages.block_table != nullptr; }
  FA_HOST_DEVICE bool any() const {
    return paged() || seqused_k != nullptr || k_start != nullptr || batch_index != nullptr;
  }
};

// The keys of one sequence: storage rows [offset_k, offset_k + len_k) of K/V batch kv_batch.
struct KvSpan {
  int len_k;
  std::int64_t offset_k;
  int kv_batch;
};

// Sequence b's keys, given its length and row offset as the problem without overrides has them
// (fixed length: seqlen_k and 0; varlen: from cu_seqlens_k).
FA_HOST_DEVICE KvSpan kv_span(const KvMap& kv, int b, int len_k, std::int64_t offset_k) {
  if (kv.paged()) offset_k = 0;  // a paged sequence's rows count from its first page
  const int start = kv.k_start != nullptr ? kv.k_start[b] : 0;
  const int end = kv.seqused_k != nullptr ? kv.seqused_k[b] + kv.appended : len_k;
  return {end - start, offset_k + start, kv.batch_index != nullptr ? kv.batch_index[b] : b};
}

// The page holding storage row `row` of sequence b (paged storage).
FA_HOST_DEVICE std::int64_t kv_page(const KvPages& pages, int b, std::int64_t row) {
  return pages.block_table[b * pages.table_stride + row / pages.page_size];
}

// Element index of (storage row `row`, head `head`, 0) of sequence b in a K or V operand whose
// strides are `batch_stride` (contiguous: between batches; paged: between pages), `seq_stride`
// and `head_stride`.
FA_HOST_DEVICE std::int64_t kv_element(const KvPages& pages, std::int64_t batch_stride, std::int64_t seq_stride,
                                       std::int64_t head_stride, int b, int kv_batch, std::int64_t row,
                                       int head) {
  if (pages.block_table == nullptr)
    return kv_batch * batch_stride + row * seq_stride + std::int64_t(head) * head_stride;
  const std::int64_t page = kv_page(pages, b, row);
  return page * batch_stride + (row % pages.page_size) * seq_stride + std::int64_t(head) * head_stride;
}

}  // namespace flashattn::detail
