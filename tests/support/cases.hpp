#pragma once
// The shared case table: every backend runs these shapes and options.
#include <cstdint>
#include <string>
#include <vector>

namespace flashattn::testing {

enum class Layout {
  bshd,    // (batch, seq, heads, dim), contiguous
  bhsd,    // stored (batch, heads, seq, dim), viewed as bshd through strides (no copy)
  padded,  // bshd with padding after every row and every head (outputs' padding must stay poisoned)
};

// ALiBi slopes: none, one per query head (heads_q,), or one per (sequence, query head).
enum class Alibi { none, heads, batch_heads };

struct Case {
  std::string name;
  int batch = 1;
  int heads_q = 2;
  int heads_kv = 2;
  int seqlen_q = 17;
  int seqlen_k = 17;
  int head_dim = 64;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  Alibi alibi = Alibi::none;  // slopes drawn at random in [0.05, 0.55) with the inputs
  float magnitude = 1.0f;  // inputs are N(0, magnitude^2)
  // Dropout probability (0 = off); the run's dropout seed and offset derive from the test seed,
  // and the reference drops the same entries (src/common/philox.hpp).
  float dropout_p = 0.0f;
  // Set by the harness from the test seed (cases leave them alone): the dropout stream, and
  // whether the call reads it from an int64 tensor in the operands' memory (dropout_state).
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  bool dropout_in_memory = false;
  std::vector<int> lens_q, lens_k;  // non-empty: variable length with these sequence lengths
  Layout layout = Layout::bshd;
  bool with_lse = true;
  int sm_margin = 0;  // AttentionOptions::sm_margin

  bool varlen() const { return !lens_q.empty(); }
};

// Which backend a table is for: each runs what it supports.
enum class TableFor { cpu, cuda };

std::vector<Case> shared_cases(TableFor backend);
// The CUDA table's cases that the e4m3 forward takes: no dropout or ALiBi, head dims that are
// multiples of 16, one layout (the others are the same problem in other strides), inputs of
// magnitude up to 2 (tests/test_cuda_backend.cpp says why).
std::vector<Case> fp8_cases();
// Tiny shapes for finite-difference gradient checks.
std::vector<Case> tiny_cases();

}  // namespace flashattn::testing
