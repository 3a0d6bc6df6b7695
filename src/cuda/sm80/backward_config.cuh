#pragma once
// The sm80 backward's tile shapes per head dim: the one place to tune them.
//
// Main kernel (dK, dV and, outside deterministic mode, dQ by atomics): a CTA of kWarps warps
// owns kBlockN keys and walks query blocks of kBlockM rows. The warps are arranged differently
// for each of its GEMMs:
//   S = Q K^T and dP = dO V^T (kBlockM x kBlockN): kSdPWarpsM warps along the query rows,
//   dV += P^T dO and dK += dS^T Q (kBlockN x HeadDim): kdKVWarpsN warps along the keys,
//   dQ = dS K (kBlockM x HeadDim): kdQWarpsM warps along the query rows.
// Shared memory: Q (two stages), dO, K, V (kBlockM|N x HeadDim), P and dS (kBlockM x kBlockN).
// These follow FlashAttention-2's choices for GPUs with >= 144 KB of shared memory per block.
//
// Deterministic dQ kernel: a CTA of kDqWarps warps owns kDqBlockM query rows (warps along the
// rows only, so dS feeds the dQ GEMM from registers) and walks key blocks of kDqBlockN.
namespace flashattn::cuda::sm80 {

template <int BlockM, int BlockN, int Warps, int SdPWarpsM, int dKVWarpsN, int dQWarpsM,
          int DqBlockN>
struct BackwardTileShape {
  static constexpr int kBlockM = BlockM, kBlockN = BlockN, kWarps = Warps;
  static constexpr int kSdPWarpsM = SdPWarpsM, kdKVWarpsN = dKVWarpsN, kdQWarpsM = dQWarpsM;
  static constexpr int kDqWarps = 4, kDqBlockM = 64, kDqBlockN = DqBlockN;
};

template <int HeadDim> struct BackwardTiles;
//                                     M    N   warps SdP dKV dQ   dq-kernel N
template <> struct BackwardTiles<32>  : BackwardTileShape<128, 128, 8,  4,  4,  4,  128> {};
template <> struct BackwardTiles<64>  : BackwardTileShape<128, 128, 8,  4,  4,  4,  128> {};
template <> struct BackwardTiles<96>  : BackwardTileShape< 64, 128, 8,  2,  4,  4,   64> {};
template <> struct BackwardTiles<128> : BackwardTileShape< 64, 128, 8,  2,  4,  2,   64> {};
template <> struct BackwardTiles<192> : BackwardTileShape< 64,  64, 8,  4,  2,  2,   32> {};
template <> struct BackwardTiles<256> : BackwardTileShape< 64,  64, 8,  4,  2,  2,   32> {};


// Tiles for GPUs with less shared memory per block than BackwardTiles needs: head dim 256 wants
// 176 KB, an A100 has 163 KB, so there it takes narrower key blocks (136 KB).
template <int HeadDim> struct LowSharedMemoryTiles { using type = BackwardTiles<HeadDim>; };
template <> struct LowSharedMemoryTiles<256> { using type = BackwardTileShape<64, 32, 8, 4, 1, 2, 32>; };

// GQA: how many CTA columns share the query heads of one KV head. One column (each CTA loops
// over the whole group, summing dK/dV in registers) needs no workspace and no reduction, but
// may leave SMs idle when there are few KV heads; then the group is split until the grid has
// about two CTAs per SM, and a fixed-order reduction sums the fp32 partials.
inline int choose_head_splits(int group_size, long long ctas_per_split, int num_sms) {
  for (int splits = 1; splits < group_size; ++splits)
    if (group_size % splits == 0 && ctas_per_split * splits >= 2LL * num_sms) return splits;
  return group_size;
}

}  // namespace flashattn::cuda::sm80
