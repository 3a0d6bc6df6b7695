#pragma once
// Runs one case of the shared table on a backend and measures it against the float64
// reference: fresh random inputs, poisoned outputs, a same-precision baseline for tolerances.
#include <cstdint>
#include <string>
#include <vector>

#include "cases.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn::testing {

// The seed for fresh random inputs: FLASHATTN_TEST_SEED if set, otherwise random per call.
std::uint64_t test_seed();

struct ForwardCheck {
  double out_error = 0;     // ||out - ref|| / ||ref||
  double out_baseline = 0;  // the same for the same-precision baseline
  double lse_error = 0;     // max |lse - ref| / max(1, |ref|) over rows that see a key
  bool all_written = true;  // no poison (NaN) left in out or lse, no NaN produced
  bool padding_untouched = true;
  bool masked_rows_ok = true;  // rows that see no key: out exactly 0, LSE -inf
  std::string describe() const;
};

struct BackwardCheck {
  double dq_error = 0, dk_error = 0, dv_error = 0;
  double dq_baseline = 0, dk_baseline = 0, dv_baseline = 0;
  bool all_written = true;
  bool padding_untouched = true;
  std::string describe() const;
};

ForwardCheck check_forward(const Case& c, DType dtype, DeviceKind device, std::uint64_t seed);
// out and LSE come from the reference (rounded to dtype), so the backward is tested alone.
BackwardCheck check_backward(const Case& c, DType dtype, DeviceKind device, std::uint64_t seed,
                             bool deterministic = false);

// Which entries of P dropout keeps, as a backend computes them: q = 0 (every visible key gets
// the same weight) and V row j = 2^(j / head_dim) e_(j % head_dim) (seqlen_k <= 3 head_dim), so
// that out[b, i, h, d], read with the row's LSE, tells which of keys d, d + head_dim and
// d + 2 head_dim are visible to query row i and kept (no ALiBi: its bias would weigh the keys).
// kept[((b * heads_q + h) * seqlen_q + i) * seqlen_k + j].
// device = cpu with `reference` set: the float64 reference's. Fixed-length cases only.
std::vector<bool> dropout_kept_entries(const Case& c, DType dtype, DeviceKind device, std::uint64_t seed,
                                       bool reference = false);

// FP8 (e4m3 inputs, CUDA on Hopper): the case's inputs drawn as for check_forward, quantized to e4m3
// with descale factors (one per (sequence, KV head); per block of kFp8ScaleBlockRows rows of Q and
// K, V per (sequence, KV head); or one per tensor: amax / 448), run with an
// f16 or bf16 output, and compared with the float64 reference on the dequantized inputs. Every
// output element must lie within
//   (2^-4 + 1e-3) * A + u * |ref|,
// where A is the reference attention over |V| (the same weights: sum_j p_j |v_j|): P rounded to
// e4m3 is off by at most 2^-4 of each entry (3 mantissa bits, round to nearest) and the kernel
// divides by the unrounded row sum, so O is off by at most 2^-4 sum_j p_j |v_j|; 1e-3 covers
// P's subnormals and float accumulation; u is the output type's rounding (2^-8 bf16, 2^-11 f16).
struct Fp8ForwardCheck {
  double worst_ratio = 0;  // max over elements of |out - ref| / bound (<= 1 passes)
  double lse_error = 0;    // as ForwardCheck
  bool all_written = true;
  bool masked_rows_ok = true;
  std::string describe() const;
};
enum class Fp8Scales { per_tensor, per_head, per_block };
Fp8ForwardCheck check_forward_fp8(const Case& c, DType out_dtype, Fp8Scales scales, std::uint64_t seed);

// Runs the backward twice on identical inputs; true if dq, dk, dv are bit-identical.
bool backward_is_reproducible(const Case& c, DType dtype, DeviceKind device, std::uint64_t seed,
                              bool deterministic);

// The tolerance rule: at most twice the same-precision baseline's error, plus a floor that
// covers rounding-only differences (and cases whose reference is exactly zero). The floor
// grows with the scores' size (magnitude^2 * sqrt(head_dim)): float accumulation of scores in
// the thousands leaves errors in P that the baseline's summation order need not reproduce.
double tolerance(double baseline, DType dtype, const Case& c);

// The LSE's tolerance (relative to max(1, |lse|)): 1e-5 in float32, 1e-3 in 16-bit types, plus
// the same score-size floor. The LSE carries each logit's float rounding unchanged (a row that
// sees one key has that key's logit as its LSE), and with scores in the thousands that rounding
// exceeds 1e-5 of an LSE near 1 (large_magnitude cases in float32: up to 5.5e-5 in 600 runs
// with fresh seeds).
double lse_tolerance(DType dtype, const Case& c);

}  // namespace flashattn::testing
