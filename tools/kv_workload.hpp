#pragma once
// The command line's KV-cache workload (`flashattn run --kv-cache`): a cache of seqlen_k rows per
// sequence, contiguous or paged (pages scattered over a pool), with `append` new rows written
// (and rotated, with rotary_dim > 0) by every call, and seqlen queries per sequence.
#include <cstdint>
#include <memory>

#include "workload.hpp"

namespace flashattn::tools {

struct KvOptions {
  int page_size = 0;   // 0: contiguous cache
  int append = 0;      // rows appended by each call (the cache's last `append` rows)
  int rotary_dim = 0;  // 0: no rotary
};

class KvWorkload {
 public:
  KvWorkload(const Shape& shape, const KvOptions& kv, std::uint64_t seed);
  ~KvWorkload();
  KvWorkload(const KvWorkload&) = delete;
  KvWorkload& operator=(const KvWorkload&) = delete;

  void forward();
  // The whole output of the last forward() against the float64 reference run on host copies
  // of the same inputs (reference::forward_kvcache): max over rows of the relative error.
  RowCheck check();
  std::size_t tensor_bytes() const;
  // Bytes of K/V the queries read (b * seqlen_k * heads_kv * d * 2 elements).
  double kv_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace flashattn::tools
