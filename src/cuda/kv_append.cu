// The append + rotary step of a KV-cache call (kv_append.cuh), as a kernel of its own before the
// attention, for the calls whose attention kernel does not do it itself: the sm80 decode kernel
// does, for up to 16 new rows (sm80/fused_append.cuh; sm80/forward_heuristics.hpp:
// fuses_kv_append); this kernel serves more new rows, the prefill tiles and the sm90 family. It
// moves a few kilobytes and costs about one kernel boundary, which the attention's programmatic
// launch (common/programmatic_launch.cuh) shortens on Hopper (docs/kernels/kv-cache.md).
#include "cuda/kv_append.cuh"

#include "common/kv_layout.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/programmatic_launch.cuh"
#include "cuda/common/rotary.cuh"

namespace flashattn::cuda {
namespace {

struct AppendParams {
  detail::ForwardProblem p;
  detail::KvAppend a;
  void* q_rotated;
  int key_rows;    // batch * seqlen_new * heads_kv rows to append
  int query_rows;  // batch * seqlen_q * heads_q rows to rotate (0: none)
};

// Copies one row of head_dim elements from src to dst, rotating [0, rotary_dim) at `position`
// when rotate is set. Each thread takes column pairs (common/rotary.cuh).
template <class T>
__device__ void copy_row(const AppendParams& P, const T* src, T* dst, int position, bool rotate) {
  const int d = P.p.head_dim;
  for (int j = threadIdx.x; j < (d + 1) / 2; j += blockDim.x)
    copy_row_pair(P.a, src, d, d, position, rotate, j, [&](int c, T x) { dst[c] = x; });
}

// One CTA per row: the first key_rows CTAs append (b, i, h) of k_new/v_new, the rest rotate
// query rows.
template <class T>
__global__ void kv_append_kernel(const __grid_constant__ AppendParams P) {
  // The attention after it (launched programmatically where it can be) may be scheduled now; it
  // waits for this grid to complete before it reads the cache or the rotated queries.
  allow_next_grid();
  int r = blockIdx.x;
  const detail::ForwardProblem& p = P.p;
  if (r < P.key_rows) {
    const int h = r % p.heads_kv;
    r /= p.heads_kv;
    const int i = r % P.a.seqlen_new, b = r / P.a.seqlen_new;
    const int position = P.a.cache_seqlens[b] + i;
    const int kv_batch = p.kv.batch_index ? p.kv.batch_index[b] : b;
    copy_row<T>(P, new_row<T>(P.a.k_new, b, i, h), cache_row<T>(p.k.data, p.k, p.kv.pages, b, kv_batch, position, h),
                position, P.a.rotates());
    copy_row<T>(P, new_row<T>(P.a.v_new, b, i, h), cache_row<T>(p.v.data, p.v, p.kv.pages, b, kv_batch, position, h),
                position, false);
    return;
  }
  r -= P.key_rows;
  const int h = r % p.heads_q;
  r /= p.heads_q;
  const int i = r % p.seqlen_q, b = r / p.seqlen_q;
  const T* src = static_cast<const T*>(p.q.data) + b * p.q.batch_stride + std::int64_t(i) * p.q.seq_stride +
                 std::int64_t(h) * p.q.head_stride;
  T* dst = static_cast<T*>(P.q_rotated) + ((std::int64_t(b) * p.seqlen_q + i) * p.heads_q + h) * p.head_dim;
  copy_row<T>(P, src, dst, P.a.query_position(b, i), true);
}

}  // namespace

void launch_kv_append(const detail::ForwardProblem& p, const detail::KvAppend& a, void* q_rotated) {
  const long long key_rows = a.appends() ? static_cast<long long>(p.batch) * a.seqlen_new * p.heads_kv : 0;
  const long long query_rows =
      a.rotates() && q_rotated != nullptr ? static_cast<long long>(p.batch) * p.seqlen_q * p.heads_q : 0;
  const long long rows = key_rows + query_rows;
  if (rows == 0) return;
  if (rows > 0x7fffffffLL)
    throw Error(ErrorKind::unsupported, "k", "at most 2^31 - 1 rows to append and rotate", std::to_string(rows));
  const AppendParams P{p, a, q_rotated, int(key_rows), int(query_rows)};
  const int threads = p.head_dim <= 64 ? 64 : 128;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (p.dtype == DType::f16)
    kv_append_kernel<__half><<<unsigned(rows), threads, 0, stream>>>(P);
  else
    kv_append_kernel<__nv_bfloat16><<<unsigned(rows), threads, 0, stream>>>(P);
  FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
