#pragma once
// Epilogue of the sm90 forward: the normalized output tile goes registers -> shared memory
// (stmatrix) -> global memory. Each consumer warpgroup stores its own 64 rows, by one TMA
// store for fixed-length batches (TMA clips the rows past seqlen_q) and by 16-byte stores
// limited to the sequence's rows for variable length (the packed tensor continues with the
// next sequence), so that no warpgroup waits for another and their ping-pong offset carries
// over into the next tile. A head dim below the width: TMA clips the columns past it, the
// 16-byte stores skip them. The LSE goes straight from registers. Up to head dim 128 the output
// has shared memory of its own; above, it is staged in the tile's last K and V stages
// (forward_traits.cuh), which the caller frees once `store` returns.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_tile.cuh"

namespace flashattn::cuda::sm90 {

template <class Traits>
struct ForwardEpilogue {
  using NamedBarrier = cutlass::arch::NamedBarrier;
  using Element = typename Traits::OutputElement;  // O's (an FP8 forward's output is 16-bit)
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kThreads = Traits::kConsumerThreads;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks

  // Where warpgroup `warp_group` stages its output. held_stage: above head dim 128, the stage
  // it keeps (the tile's last K stage or its last V stage, forward_traits.cuh).
  CUTE_DEVICE static Element* staging(typename Traits::SharedStorage& smem, int warp_group, int held_stage) {
    if constexpr (Traits::kOutputInKVStages)
      return reinterpret_cast<Element*>((warp_group == Traits::kKeyStageKeeper ? smem.k.data() : smem.v.data()) +
                                        held_stage * Traits::kStageElems);
    else
      return smem.o.data() + warp_group * Traits::kOutputElems;
  }

  CUTE_DEVICE static Element* output_rows(ForwardParams<Traits> const& p, TileWork const& w) {
    return static_cast<Element*>(p.out) + w.coord.batch * p.out_batch_stride +
           std::int64_t(w.seq.row_q + w.row0) * p.out_seq_stride + w.coord.head * p.out_head_stride;
  }

  CUTE_DEVICE static float* lse_rows(ForwardParams<Traits> const& p, TileWork const& w) {
    return p.lse + w.coord.batch * p.lse_batch_stride + w.coord.head * p.lse_head_stride +
           w.seq.row_q + w.row0;
  }

  // tOrO: this thread's fp32 output fragment (already normalized); lse: its rows' LSE;
  // coords: (row, col) of each fragment element within the tile (row-column view).
  template <class FragO, class Coords, int kRows>
  // held_stage: see staging().
  CUTE_DEVICE static void store(ForwardParams<Traits> const& p, typename Traits::SharedStorage& smem, int held_stage,
                                TileWork const& w, FragO const& tOrO, Coords const& coords, const float (&lse)[kRows],
                                int thread) {
    using namespace cute;
    if (p.lse != nullptr && thread % 4 == 0) {  // the quad's first lane holds the row
      float* out_lse = lse_rows(p, w);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(coords(r, 0));
        if (row < w.rows) out_lse[row] = lse[r];
      }
    }

    // This warpgroup's part of the tile: rows [64 * warp_group, 64 * warp_group + 64).
    const int warp_group = thread / 128, lane = thread % 128;
    Tensor sO = make_tensor(make_smem_ptr(staging(smem, warp_group, held_stage)), typename Traits::SmemLayoutO{});
    auto smem_copy = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::WarpGroupMmaPV{});
    auto thread_copy = smem_copy.get_thread_slice(lane);
    Tensor converted = convert_fragment<Element>(tOrO);
    Tensor src = thread_copy.retile_S(converted);
    Tensor dst = thread_copy.partition_D(sO);

    if constexpr (Traits::kOutputInKVStages) {
      // The other warpgroup must be done reading the stage (this one is: its GEMMs are complete).
      NamedBarrier::sync(2 * 128, warp_group == Traits::kKeyStageKeeper ? kBarrierLastKeyStageRead
                                                                         : kBarrierLastValueStageRead);
    } else {
      // This warpgroup's previous store must have finished reading its part.
      if (lane == 0) tma_store_wait<0>();
      NamedBarrier::sync(128, kBarrierEpilogueWarpGroup0 + warp_group);
    }
    copy(smem_copy, src, dst);
    cutlass::arch::fence_view_async_shared();  // make the stores visible to the TMA unit
    NamedBarrier::sync(128, kBarrierEpilogueWarpGroup0 + warp_group);

    const int row0 = warp_group * Traits::kRowsPerWarpGroup;
    if (p.cu_seqlens_q == nullptr) {
      if (lane == 0 && row0 < w.rows) {  // TMA clips the rows past seqlen_q
        Tensor mO = p.tma_o.get_tma_tensor(p.shape_o);
        Tensor gO = local_tile(mO(_, _, w.coord.head, w.coord.batch),
                               Shape<Int<Traits::kRowsPerWarpGroup>, Int<kHeadDim>>{},
                               make_coord(w.coord.m_block * Traits::kConsumerWarpGroups + warp_group, _0{}));
        auto tma_o = p.tma_o.get_slice(_0{});
        copy(p.tma_o, tma_o.partition_S(sO), tma_o.partition_D(gO));
        tma_store_arrive();
      }
    } else {
      Element* out = output_rows(p, w) + std::int64_t(row0) * p.out_seq_stride;
      const int rows = min(Traits::kRowsPerWarpGroup, w.rows - row0);
      // Not unrolled: peeled iterations had their addresses computed at the kernel's start and
      // held through the mainloop, which spilled them at d = 192 / 256 and with 192-row tiles.
#pragma unroll 1
      for (int i = lane; i < rows * kChunksPerRow; i += 128) {
        const int row = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
        if (col < p.head_dim)  // a head dim below the width: its columns only
          *reinterpret_cast<uint4*>(out + row * p.out_seq_stride + col) =
              *reinterpret_cast<const uint4*>(&sO(row, col));
      }
    }

    // In a K/V stage, the store must have read it before the caller frees the stage.
    if constexpr (Traits::kOutputInKVStages)
      if (lane == 0) tma_store_wait<0>();
  }

  // A tile whose rows see no key: output 0 and LSE -inf, written directly (no shared memory:
  // the producer skipped the tile and may be filling Q's memory for the next one).
  CUTE_DEVICE static void store_empty(ForwardParams<Traits> const& p, TileWork const& w, int thread) {
    Element* out = output_rows(p, w);
    for (int i = thread; i < w.rows * kChunksPerRow; i += kThreads) {
      const int row = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      if (col < p.head_dim) *reinterpret_cast<uint4*>(out + row * p.out_seq_stride + col) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != nullptr) {
      float* out_lse = lse_rows(p, w);
      for (int row = thread; row < w.rows; row += kThreads) out_lse[row] = -INFINITY;
    }
  }
};

}  // namespace flashattn::cuda::sm90
