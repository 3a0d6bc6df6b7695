#pragma once
// One attention workload of the command line: shape, options, random inputs on a backend,
// forward/backward calls, FLOP counts and a sampled check against the float64 reference.
#include <cstdint>
#include <memory>
#include <string>

#include "flashattn/attention.hpp"

namespace flashattn::tools {

struct Shape {
  int batch = 1, heads = 16, heads_kv = 0 /* 0: = heads */, seqlen = 1024, seqlen_k = 0 /* 0: = seqlen */;
  int head_dim = 128;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0;
  float dropout = 0;  // dropout_p; the stream's seed is the workload's seed, its offset 0
  bool alibi = false;  // ALiBi with the standard geometric slopes 2^(-8k/heads), k = 1..heads
  bool deterministic = false;  // backward: the same bits on every run
  DType dtype = DType::bf16;
  bool fp8_blocks = false;  // e4m3: q_descale and k_descale per block of rows (all 1), else none
  DeviceKind device = DeviceKind::cpu;

  int kv_heads() const { return heads_kv > 0 ? heads_kv : heads; }
  int keys() const { return seqlen_k > 0 ? seqlen_k : seqlen; }
  std::string describe() const;
};

// FLOPs as the FlashAttention papers count them: 4*b*h*n_q*n_k*d forward (visible pairs only
// for causal/windows, which for the square causal case is half), backward 2.5x the forward.
double forward_flops(const Shape& s);
inline double backward_flops(const Shape& s) { return 2.5 * forward_flops(s); }

struct RowCheck {
  int rows = 0;
  double max_error = 0;  // max over sampled rows of ||row - ref|| / ||ref|| (absolute if ref = 0)
  double tolerance = 0;
  bool ok() const { return max_error <= tolerance; }
};

class Workload {
 public:
  explicit Workload(const Shape& shape, std::uint64_t seed = 0);
  ~Workload();
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  void forward();
  void backward();  // uses the outputs of the last forward()
  void synchronize();
  // Compares `rows` random output rows of the last forward() with the float64 reference.
  RowCheck check_forward_rows(int rows);
  std::size_t tensor_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace flashattn::tools
