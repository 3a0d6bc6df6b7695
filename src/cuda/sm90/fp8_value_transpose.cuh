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
// It reads and writes V once (1 byte per element each way): 17 us at 16k tokens x hidden 2048 on
// an H200 (3.9 TB/s; 4.3 for a device-to-device copy, as recorded for that machine), 8-11% of a call at n = 1k, 3-4% at 4k
// (docs/kernels/fp8-forward.md). Calls where few query rows read each KV head's V write V^T in the
// kernel instead (fp8_value_transposer.cuh; forward_heuristics.hpp: fp8_transposes_value_in_kernel).
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

// One CTA moves a tile of 128 keys x 128 head-dim bytes: its 128 threads read the tile's rows into
// shared memory (16 bytes each, 8 a thread), then each takes 16 keys x 8 dims of it by 8-byte
// loads, transposes them in registers with byte permutes (4 x 4 blocks) and writes 8 rows of V^T,
// 16 keys each. The first version gathered single bytes from shared memory (16 loads for 16
// bytes out): 24-25 us at the size above, 2.7 TB/s.
constexpr int kTransposeKeys = 128, kTransposeDims = 128, kTransposeThreads = 128;

// Where key `key`'s 8-byte column `column` (dims 8 column ..) lies in its shared-memory row: the
// columns XORed with the key's group of 16, so that the 8-byte loads of 8 groups and 2 columns
// (half a warp) fall in 16 different bank pairs.
CUTE_DEVICE int transpose_column(int key, int column) { return column ^ (((key >> 4) & 7) << 1); }

// 4 x 4 bytes: word i of `in` holds 4 dims of key i; word j of the result, dim j of the 4 keys.
CUTE_DEVICE void transpose_4x4_bytes(const std::uint32_t (&in)[4], std::uint32_t (&out)[4]) {
  const std::uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), lo23 = __byte_perm(in[2], in[3], 0x5140);
  const std::uint32_t hi01 = __byte_perm(in[0], in[1], 0x7362), hi23 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(lo01, lo23, 0x5410);
  out[1] = __byte_perm(lo01, lo23, 0x7632);
  out[2] = __byte_perm(hi01, hi23, 0x5410);
  out[3] = __byte_perm(hi01, hi23, 0x7632);
}

// grid (key tiles, head-dim tiles, batch * heads), kTransposeThreads threads. A template so that
// every kernel instance's translation unit may include it.
template <int kKeys = kTransposeKeys>
__global__ void __launch_bounds__(kTransposeThreads) transpose_value_kernel(const ValueTransposeArgs a) {
  static_assert(kKeys == 128 && kTransposeDims == 128 && kTransposeThreads == 128, "the thread mapping below");
  __shared__ alignas(16) std::uint8_t tile[kKeys][kTransposeDims];  // [key][column ^ swizzle]
  const int b = blockIdx.z / a.heads, h = blockIdx.z % a.heads;
  const std::int64_t key0 = std::int64_t(blockIdx.x) * kKeys;
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
  const int dim0 = blockIdx.y * kTransposeDims;
  const int t = threadIdx.x;

  // Rows in: thread t copies 16 bytes (dims 16 (t % 8) ..) of keys t / 8 + 16 i by cp.async, all 8
  // in flight at once (register loads had ptxas store the first two to shared memory before
  // issuing the rest); keys past the sequence are filled with zeros (V^T's padding), dims past the
  // head dim are never written out.
  {
    const int chunk = t % 8;
    const bool dims_in = dim0 + 16 * chunk < a.head_dim;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int key = t / 8 + 16 * i;  // the swizzle is even: a 16-byte chunk stays one
      const bool in = key0 + key < rows && dims_in;
      const std::uint8_t* src = in ? a.v + b * a.batch_stride + (first_row + key0 + key) * a.seq_stride +
                                         h * a.head_stride + dim0 + 16 * chunk
                                   : a.v;  // not read: zero bytes copied, 16 filled
      const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(&tile[key][8 * transpose_column(key, 2 * chunk)]));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0));
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
  }
  __syncthreads();

  // Out: thread t takes keys 16 g .. of its group g = t % 8 and dims 8 c .. of column c = t / 8.
  const int g = t % 8, c = t / 8;
  if (key0 + 16 * g >= keys_padded || dim0 + 8 * c >= a.head_dim) return;
  std::uint32_t keys[16][2];  // [key in group][dims 8c .. 8c + 3, 8c + 4 .. 8c + 7]
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const uint2 w = *reinterpret_cast<const uint2*>(&tile[16 * g + j][8 * transpose_column(16 * g + j, c)]);
    keys[j][0] = w.x;
    keys[j][1] = w.y;
  }
  // Output word i of a dim row holds slots 4i .. 4i + 3: keys 2i, 2i + 1, 2i + 8, 2i + 9 of the
  // group (transposed_value_key).
  std::uint32_t out[8][4];  // [dim][word]
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    static_assert(transposed_value_key(0) == 0 && transposed_value_key(1) == 1 && transposed_value_key(2) == 8 &&
                  transposed_value_key(3) == 9 && transposed_value_key(4) == 2);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::uint32_t quad[4] = {keys[2 * i][half], keys[2 * i + 1][half], keys[2 * i + 8][half],
                                     keys[2 * i + 9][half]};
      std::uint32_t dims[4];
      transpose_4x4_bytes(quad, dims);
#pragma unroll
      for (int e = 0; e < 4; ++e) out[4 * half + e][i] = dims[e];
    }
  }
  std::uint8_t* row = a.vt + ((std::int64_t(out_b) * a.heads + h) * a.head_dim + dim0 + 8 * c) * a.keys_padded +
                      out_key0 + key0 + 16 * g;
#pragma unroll
  for (int e = 0; e < 8; ++e)
    *reinterpret_cast<uint4*>(row + std::int64_t(e) * a.keys_padded) = make_uint4(out[e][0], out[e][1], out[e][2], out[e][3]);
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
template <int kKeys = kTransposeKeys>
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
  const dim3 grid(unsigned((transposed_value_keys(a.rows) + kKeys - 1) / kKeys),
                  unsigned((a.head_dim + kTransposeDims - 1) / kTransposeDims), unsigned(batch * a.heads));
  transpose_value_kernel<kKeys><<<grid, kTransposeThreads, 0, stream>>>(a);
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashattn::cuda::sm90
