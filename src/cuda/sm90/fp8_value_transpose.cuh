#pragma once
// V^T for the FP8 forward. An 8-bit wgmma reads both operands K-major, and O = P V reduces over
// keys, so V must arrive with its keys contiguous: this kernel writes V (rows, heads_kv, head
// dim, any strides) as V^T (batch, heads_kv, head dim, keys_padded), keys padded with zeros to a
// multiple of 16 (TMA's 16-byte stride rule), into workspace the forward then reads by TMA.
// Within each 16 keys, V^T's keys are in the order in which a thread's accumulator of S holds
// them (transposed_value_key), so that P becomes the second wgmma's A operand without moving
// between threads (fp8_probabilities.cuh); the order repeats every 16 keys from a sequence's
// first, and every key block of the forward starts at a multiple of 16 keys.
// Variable length: one packed key axis in which every sequence starts at a multiple of 16
// (transposed_value_start): a TMA box whose start along the contiguous axis was not 16-byte
// aligned stopped the kernel with an illegal instruction (H100, 2026-11-26).
// It reads and writes V once (1 byte per element each way): bandwidth-bound, a few percent of
// the forward from n = 4k (docs/kernels/fp8-forward.md has the measured cost).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include <cute/config.hpp>

#include "common/problem.hpp"
#include "cuda/common/check.cuh"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm90 {

// Which key of its group of 16 V^T stores at position `slot` (0-15): slot 4u + i holds key 2u + (i & 1)
// + 8 (i >> 1), the keys that quad lane u's accumulator of S holds, in its order (columns 2u, 2u + 1
// of the first 8 keys, then of the second 8).
CUTE_HOST_DEVICE constexpr int transposed_value_key(int slot) {
  return 2 * (slot >> 2) + (slot & 1) + 8 * ((slot >> 1) & 1);
}

// Keys of a sequence's V^T rows (its row length in bytes): a multiple of 16.
CUTE_HOST_DEVICE std::int64_t transposed_value_keys(std::int64_t rows) { return (rows + 15) / 16 * 16; }

// Variable length: where sequence b (its keys from cu_seqlens_k[b] = key0 on) starts on V^T's
// packed key axis: key0 rounded up to 16, plus 16 per earlier sequence, so that each start is a
// multiple of 16 and no sequence reaches the next one's start.
CUTE_HOST_DEVICE std::int64_t transposed_value_start(std::int64_t key0, int b) {
  return (key0 + 15) / 16 * 16 + 16 * std::int64_t(b);
}
// The packed axis' length for `batch` sequences of `total_k` keys in all.
inline std::int64_t transposed_value_packed_keys(std::int64_t total_k, int batch) {
  return transposed_value_start(total_k, batch);
}

struct ValueTransposeArgs {
  const std::uint8_t* v;  // element (b, row, h, d) at b * batch_stride + row * seq_stride + h * head_stride + d
  std::int64_t batch_stride, seq_stride, head_stride;
  std::uint8_t* vt;  // element (b, h, d, key) at ((b * heads + h) * head_dim + d) * keys_padded + key
  std::int64_t rows, keys_padded;
  int heads, head_dim;
  // Variable length (null: fixed): sequence b's rows start at row cu_seqlens_k[b] of v and at key
  // transposed_value_start(cu_seqlens_k[b], b) of V^T's one packed axis (batch_stride 0).
  const std::int32_t* cu_seqlens_k;
};

constexpr int kTransposeTile = 64;  // keys x head-dim bytes per CTA

// grid (key tiles, head-dim tiles, batch * heads), 256 threads: each reads 16 bytes of a key's
// row and writes 16 keys of a head-dim row. A template so that every kernel instance's
// translation unit may include it.
template <int kTile = kTransposeTile>
__global__ void __launch_bounds__(256) transpose_value_kernel(const ValueTransposeArgs a) {
  static_assert(kTile == 64, "256 threads: 64 rows of 4 x 16 bytes");
  __shared__ std::uint8_t tile[kTile][kTile + 4];  // [key][dim]; +4 spreads the banks
  const int b = blockIdx.z / a.heads, h = blockIdx.z % a.heads;
  const std::int64_t key0 = std::int64_t(blockIdx.x) * kTile;
  std::int64_t rows = a.rows, keys_padded = a.keys_padded, first_row = 0, out_key0 = 0;
  int out_b = b;
  if (a.cu_seqlens_k != nullptr) {  // this sequence's keys, on the packed axes
    first_row = a.cu_seqlens_k[b];
    rows = a.cu_seqlens_k[b + 1] - first_row;
    keys_padded = transposed_value_keys(rows);
    out_key0 = transposed_value_start(first_row, b);
    out_b = 0;
  }
  if (key0 >= keys_padded) return;
  const int dim0 = blockIdx.y * kTile;
  const int t = threadIdx.x, row = t / 4, chunk = (t % 4) * 16;

  uint4 in = make_uint4(0, 0, 0, 0);
  if (key0 + row < rows && dim0 + chunk < a.head_dim)
    in = *reinterpret_cast<const uint4*>(a.v + b * a.batch_stride + (first_row + key0 + row) * a.seq_stride +
                                         h * a.head_stride + dim0 + chunk);
  const std::uint32_t words[4] = {in.x, in.y, in.z, in.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) *reinterpret_cast<std::uint32_t*>(&tile[row][chunk + 4 * i]) = words[i];
  __syncthreads();

  const int dim = dim0 + row;  // this thread writes keys key0 + chunk .. + 15 (one group) of head-dim row `dim`
  if (dim >= a.head_dim || key0 + chunk >= keys_padded) return;
  std::uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i] = 0;
#pragma unroll
    for (int byte = 0; byte < 4; ++byte)
      out[i] |= std::uint32_t(tile[chunk + transposed_value_key(4 * i + byte)][row]) << (8 * byte);
  }
  *reinterpret_cast<uint4*>(a.vt + ((std::int64_t(out_b) * a.heads + h) * a.head_dim + dim) * a.keys_padded +
                            out_key0 + key0 + chunk) = make_uint4(out[0], out[1], out[2], out[3]);
}

// The keys of one (head, head-dim row) of V^T: seqlen_k padded, or the packed axis.
inline std::int64_t transposed_value_row_keys(const detail::ForwardProblem& p) {
  return p.is_varlen() ? transposed_value_packed_keys(p.total_k, p.batch) : transposed_value_keys(p.seqlen_k);
}

// Bytes of V^T: (batch, or 1 packed) * heads_kv * head_dim * transposed_value_row_keys.
inline std::size_t transposed_value_bytes(const detail::ForwardProblem& p) {
  return std::size_t(p.is_varlen() ? 1 : p.batch) * p.heads_kv * p.head_dim * transposed_value_row_keys(p);
}

// V of problem p into vt (transposed_value_bytes). A template so that only the FP8 kernels'
// translation units instantiate the transpose kernel.
template <int kTile = kTransposeTile>
void transpose_value(const detail::ForwardProblem& p, void* vt, cudaStream_t stream) {
  const bool varlen = p.is_varlen();
  ValueTransposeArgs a{};
  a.v = static_cast<const std::uint8_t*>(p.v.data);
  a.batch_stride = varlen ? 0 : p.v.batch_stride;
  a.seq_stride = p.v.seq_stride;
  a.head_stride = p.v.head_stride;
  a.vt = static_cast<std::uint8_t*>(vt);
  a.rows = p.seqlen_k;  // varlen: max_seqlen_k, which sizes the grid (each CTA reads its sequence's length)
  a.keys_padded = transposed_value_row_keys(p);
  a.heads = p.heads_kv;
  a.head_dim = p.head_dim;
  a.cu_seqlens_k = varlen ? p.cu_seqlens_k : nullptr;
  const int batch = p.batch;
  if (a.rows == 0 || batch == 0) return;
  if (std::int64_t(batch) * a.heads > 65535)
    throw Error(ErrorKind::unsupported, "batch * heads_kv", "at most 65535 with e4m3 inputs (V's transpose grid)",
                std::to_string(std::int64_t(batch) * a.heads));
  const dim3 grid(unsigned((transposed_value_keys(a.rows) + kTile - 1) / kTile), unsigned((a.head_dim + kTile - 1) / kTile),
                  unsigned(batch * a.heads));
  transpose_value_kernel<kTile><<<grid, 256, 0, stream>>>(a);
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashattn::cuda::sm90
