#pragma once
// The zigzag sharding of a rank's tensors (include/flashattn/distributed.hpp): two halves,
// chunk r and chunk 2 * size - 1 - r of the global sequence, and views of them.
#include <cstdint>

#include "dist/workspace.hpp"
#include "flashattn/attention.hpp"

namespace flashattn::dist::detail {

struct Zigzag {
  int size = 1, rank = 0;
  bool varlen = false;
  std::int64_t half = 0;          // rows of one half: c (fixed length) or local_total / 2
  std::int32_t* cu_half = nullptr;  // varlen: the global offsets / (2 * size), on q's device
  int documents = 0;
  int max_half = 0;               // varlen: the longest document's chunk

  int seq_dim() const { return varlen ? 0 : 1; }
  int lse_seq_dim() const { return varlen ? 1 : 2; }
  // Half `h` (0, 1) of a (batch, 2c, heads, d) / (total, heads, d) tensor; h = 2: the whole.
  TensorView part(const TensorView& x, int h) const {
    return h == 2 ? x : slice(x, seq_dim(), h * half, half);
  }
  TensorView lse_part(const TensorView& lse, int h) const {
    return h == 2 ? lse : slice(lse, lse_seq_dim(), h * half, half);
  }
  // An LSE view indexed like the rows of the outputs ((batch, seq, heads) / (total, heads)).
  TensorView lse_rows(const TensorView& lse) const {
    return varlen ? transpose(lse, 0, 1) : transpose(lse, 1, 2);
  }
  // The global chunk index of this rank's half h.
  int chunk_of(int r, int h) const { return h == 0 ? r : 2 * size - 1 - r; }
};

// One attention call of a ring step: query half qh (0, 1) against key part kp (0, 1, or 2 =
// both halves), causal or not.
struct RingWork {
  int qh = 0, kp = 0;
  bool causal = false;
};

// The calls rank r makes against the K/V that rank s holds. Chunks: query chunk cq sees key
// chunk ck fully when cq > ck, causally when equal, not at all when cq < ck. With fixed
// lengths, a query half that sees key half 0 fully and key half 1 fully or causally makes one
// call against both halves (causal bottom-right alignment of c queries against 2c keys is
// exactly that); variable-length halves are separate batches, so they stay separate calls.
inline int ring_works(const Zigzag& z, int r, int s, bool causal, RingWork (&works)[4]) {
  int n = 0;
  enum { skip, full, diag };
  for (int qh = 0; qh < 2; ++qh) {
    int mode[2];
    for (int kh = 0; kh < 2; ++kh) {
      const int cq = z.chunk_of(r, qh), ck = z.chunk_of(s, kh);
      mode[kh] = !causal ? full : cq > ck ? full : cq == ck ? diag : skip;
    }
    if (!z.varlen && mode[0] == full && mode[1] != skip) {
      works[n++] = RingWork{qh, 2, mode[1] == diag};
      continue;
    }
    for (int kh = 0; kh < 2; ++kh)
      if (mode[kh] != skip) works[n++] = RingWork{qh, kh, mode[kh] == diag};
  }
  return n;
}

}  // namespace flashattn::dist::detail
