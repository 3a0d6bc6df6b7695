#pragma once
// The validated form of a quantize_e4m3 call (flashattn/fp8.hpp), which both backends consume.
#include <cstdint>

#include "common/host_device.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn::detail {

struct QuantizeProblem {
  DeviceKind device = DeviceKind::cpu;
  int device_index = 0;
  void* stream = nullptr;
  DType dtype = DType::f32;  // x's
  int batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  int slots_per_sequence = 1;  // heads_kv (0 sequences' worth with per_tensor: one slot)
  int blocks = 1;              // blocks of kFp8ScaleBlockRows rows per (sequence, KV head) with per_block, else 1
  bool per_tensor = false;
  // Element (b, s, h, d) at base + b * batch_stride + s * seq_stride + h * head_stride + d.
  const void* x = nullptr;
  std::int64_t x_batch_stride = 0, x_seq_stride = 0, x_head_stride = 0;
  std::uint8_t* out = nullptr;
  std::int64_t out_batch_stride = 0, out_seq_stride = 0, out_head_stride = 0;
  float* descale = nullptr;      // slots() floats: slot (b, g, block) at descale_offset
  std::int64_t descale_batch_stride = 0, descale_head_stride = 0;  // blocks contiguous
  const float* signs = nullptr;  // null: no transform
  float transform_scale = 1.0f;  // 1 / sqrt(head_dim), the same float on every backend

  // Slots are numbered densely ((b, KV head, block) row-major); row s of head h of sequence b
  // belongs to slot(b, s, h), whose factor is stored at descale[descale_offset(slot)].
  FA_HOST_DEVICE int slots() const { return per_tensor ? 1 : batch * slots_per_sequence * blocks; }
  FA_HOST_DEVICE int slot(int b, int s, int h) const {
    if (per_tensor) return 0;
    const int block = blocks > 1 ? s / kFp8ScaleBlockRows : 0;
    return (b * slots_per_sequence + h / (heads / slots_per_sequence)) * blocks + block;
  }
  FA_HOST_DEVICE std::int64_t descale_offset(int slot) const {
    if (per_tensor) return 0;
    const int block = slot % blocks, group = slot / blocks;
    return (group / slots_per_sequence) * descale_batch_stride + (group % slots_per_sequence) * descale_head_stride +
           block;
  }
};

// e4m3's largest finite value: a slot's factor is its amax / 448 (at least kMinDescale).
constexpr float kE4m3Max = 448.0f;
constexpr float kMinDescale = 1e-30f;

}  // namespace flashattn::detail
