// DeviceOps on CUDA: stream-ordered allocation from the library's workspace pool and small
// memory-bound kernels over strided views of rank <= 4 (the dtypes are runtime arguments: one
// instance serves every dtype). Contiguous views (the ring's accumulators and most of its
// copies) and views of contiguous rows (the all-to-all's head slices, batch slices) take 16-byte
// vectors of 8 elements: element by element the ring's moved about 1.1 TB/s and took 23 ms of a
// rank's forward and backward at 128k tokens on two H100s (10 ms in vectors).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/common/workspace_pool.cuh"
#include "dist/ops.hpp"
#include "dist/workspace.hpp"
#include "flashattn/error.hpp"

namespace flashattn::dist::detail {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorKind::runtime, what, "cudaSuccess", cudaGetErrorString(e));
}

struct View {
  char* data;
  int dtype;  // 0 f32, 1 f16, 2 bf16
  long long shape[4];
  long long stride[4];
};

View view_of(const TensorView& t, int rank) {
  View v{static_cast<char*>(t.data), t.dtype == DType::f32 ? 0 : t.dtype == DType::f16 ? 1 : 2, {1, 1, 1, 1}, {0, 0, 0, 0}};
  const int pad = rank - t.rank;
  for (int i = 0; i < t.rank; ++i) {
    v.shape[pad + i] = t.shape[i];
    v.stride[pad + i] = t.stride[i];
  }
  return v;
}

__device__ float load(const View& v, long long off) {
  if (v.dtype == 0) return reinterpret_cast<const float*>(v.data)[off];
  if (v.dtype == 1) return __half2float(reinterpret_cast<const __half*>(v.data)[off]);
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(v.data)[off]);
}
__device__ void store(const View& v, long long off, float x) {
  if (v.dtype == 0)
    reinterpret_cast<float*>(v.data)[off] = x;
  else if (v.dtype == 1)
    reinterpret_cast<__half*>(v.data)[off] = __float2half_rn(x);
  else
    reinterpret_cast<__nv_bfloat16*>(v.data)[off] = __float2bfloat16_rn(x);
}
__device__ long long offset(const View& v, long long i) {
  long long off = 0;
  for (int d = 3; d >= 0; --d) {
    off += (i % v.shape[d]) * v.stride[d];
    i /= v.shape[d];
  }
  return off;
}

// Two 16-bit values (dtype 1: f16, 2: bf16) of one word as floats, and back.
__device__ float2 unpack2(unsigned w, int dtype) {
  return dtype == 1 ? __half22float2(*reinterpret_cast<const __half2*>(&w))
                    : __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
__device__ unsigned pack2(float a, float b, int dtype) {
  if (dtype == 1) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}

// N (4 or 8) consecutive elements at offset `i`, a multiple of N, in one or two 16-byte loads
// (f32) or one 8- or 16-byte load (16-bit values); the data aligned to match.
template <int N>
__device__ void load_n(const View& v, long long i, float (&x)[N]) {
  if (v.dtype == 0) {
    const float4* p = reinterpret_cast<const float4*>(v.data) + i / 4;
    for (int j = 0; j < N / 4; ++j) {
      const float4 a = p[j];
      x[4 * j] = a.x, x[4 * j + 1] = a.y, x[4 * j + 2] = a.z, x[4 * j + 3] = a.w;
    }
    return;
  }
  unsigned w[N / 2];
  if constexpr (N == 8) {
    const uint4 u = reinterpret_cast<const uint4*>(v.data)[i / 8];
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
  } else {
    const uint2 u = reinterpret_cast<const uint2*>(v.data)[i / 4];
    w[0] = u.x, w[1] = u.y;
  }
  for (int j = 0; j < N / 2; ++j) {
    const float2 f = unpack2(w[j], v.dtype);
    x[2 * j] = f.x, x[2 * j + 1] = f.y;
  }
}
template <int N>
__device__ void store_n(const View& v, long long i, const float (&x)[N]) {
  if (v.dtype == 0) {
    float4* p = reinterpret_cast<float4*>(v.data) + i / 4;
    for (int j = 0; j < N / 4; ++j) p[j] = make_float4(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]);
    return;
  }
  unsigned w[N / 2];
  for (int j = 0; j < N / 2; ++j) w[j] = pack2(x[2 * j], x[2 * j + 1], v.dtype);
  if constexpr (N == 8)
    reinterpret_cast<uint4*>(v.data)[i / 8] = make_uint4(w[0], w[1], w[2], w[3]);
  else
    reinterpret_cast<uint2*>(v.data)[i / 4] = make_uint2(w[0], w[1]);
}

// The elementwise ops 8 elements a thread and step (n a multiple of 8): on contiguous views
// (`flat`: an element's offset is its index), or on views whose rows of the last dimension are
// contiguous and hold a multiple of 8 elements, with every other stride a multiple of 8 (head or
// batch slices), where 8 consecutive indices are 8 consecutive elements.
__global__ void elementwise8(View dst, View a, View b, long long n, int op, float value, bool flat) {
  for (long long i = 8 * (blockIdx.x * (long long)blockDim.x + threadIdx.x); i < n; i += 8LL * gridDim.x * blockDim.x) {
    float x[8];
    if (op == 2) {
      for (float& e : x) e = value;
    } else {
      load_n<8>(a, flat ? i : offset(a, i), x);
      if (op == 1) {
        float y[8];
        load_n<8>(b, flat ? i : offset(b, i), y);
        for (int j = 0; j < 8; ++j) x[j] += y[j];
      }
    }
    store_n<8>(dst, flat ? i : offset(dst, i), x);
  }
}

// op 0: dst = a; 1: dst = a + b; 2: dst = value. `flat`: every view is row-major contiguous, so
// an element's offset is its index (the common case: workspace and whole-tensor copies).
__global__ void elementwise(View dst, View a, View b, long long n, int op, float value, bool flat) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long d = flat ? i : offset(dst, i);
    float x = value;
    if (op != 2) x = load(a, flat ? i : offset(a, i));
    if (op == 1) x += load(b, flat ? i : offset(b, i));
    store(dst, d, x);
  }
}

// One warp per row (a grid-stride loop over rows): rows are indexed by the lse views (padded to
// rank 4: dims 1..3), the head dimension is the outputs' last; out dim d - 1 pairs with lse dim d.
// dst may be the accumulator itself. `vec4`: the head dimension is contiguous in all three
// outputs and their rows start on 4-element boundaries, so each lane takes 4 elements at a time.
__global__ void merge_rows(View dst_out, View dst_lse, View out_acc, View lse_acc, View out, View lse, long long rows,
                           long long head_dim, bool vec4) {
  const int lane = threadIdx.x % 32;
  const long long warps = (long long)gridDim.x * blockDim.x / 32;
  const float* lacc = reinterpret_cast<const float*>(lse_acc.data);
  const float* acc = reinterpret_cast<const float*>(out_acc.data);
  float* ldst = reinterpret_cast<float*>(dst_lse.data);
  const long long sa = out_acc.stride[3], so = out.stride[3], sd = dst_out.stride[3];
  for (long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; row < rows; row += warps) {
    long long oa = 0, os = 0, od = 0, la = 0, ls = 0, ld = 0, i = row;
    for (int d = 3; d >= 1; --d) {
      const long long idx = i % lse_acc.shape[d];
      i /= lse_acc.shape[d];
      la += idx * lse_acc.stride[d];
      ls += idx * lse.stride[d];
      ld += idx * dst_lse.stride[d];
      oa += idx * out_acc.stride[d - 1];
      os += idx * out.stride[d - 1];
      od += idx * dst_out.stride[d - 1];
    }
    const float a = lacc[la], s = reinterpret_cast<const float*>(lse.data)[ls];
    const float m = fmaxf(a, s);
    // The whole warp takes the same branch: the row is the same for every lane.
    float ca = 0.0f, cs = 0.0f, merged = -INFINITY;
    if (m != -INFINITY) {
      const float wa = expf(a - m), ws = expf(s - m), total = wa + ws;
      ca = wa / total, cs = ws / total, merged = m + logf(total);
    }
    if (vec4) {
      for (long long j = 4 * lane; j < head_dim; j += 128) {
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f}, y[4];
        if (m != -INFINITY) {
          load_n<4>(out_acc, oa + j, x);
          load_n<4>(out, os + j, y);
          for (int e = 0; e < 4; ++e) x[e] = x[e] * ca + y[e] * cs;
        }
        store_n<4>(dst_out, od + j, x);
      }
    } else {
      for (long long j = lane; j < head_dim; j += 32)
        store(dst_out, od + j * sd, m == -INFINITY ? 0.0f : acc[oa + j * sa] * ca + load(out, os + j * so) * cs);
    }
    __syncwarp();
    if (lane == 0) ldst[ld] = merged;
    __syncwarp();
  }
}

__global__ void divide(std::int32_t* dst, const std::int32_t* src, int count, int divisor) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = src[i] / divisor;
}

bool aligned16(const TensorView& t) { return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0; }

// The last dimension contiguous with a multiple of n elements, every other stride a multiple of
// n: n consecutive indices are n consecutive elements, starting on an n-element boundary.
bool rows_of(const TensorView& t, int n) {
  if (t.rank == 0 || t.stride[t.rank - 1] != 1 || t.shape[t.rank - 1] % n != 0) return false;
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.shape[i] != 1 && t.stride[i] % n != 0) return false;
  return true;
}

int blocks_for(long long n, int threads) {
  const long long b = (n + threads - 1) / threads;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

class CudaOps final : public DeviceOps {
 public:
  void* allocate(std::size_t bytes, void* stream) const override {
    // The library's pool: the default one gives memory back at every synchronization, and the
    // ring's few GB of buffers were mapped again at each call.
    return flashattn::cuda::workspace_alloc_async(bytes > 0 ? bytes : 1, static_cast<cudaStream_t>(stream));
  }
  void release(void* data, void* stream) const override { cudaFreeAsync(data, static_cast<cudaStream_t>(stream)); }
  void copy_bytes(void* dst, const void* src, std::size_t bytes, void* stream) const override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
  }
  void copy(const TensorView& dst, const TensorView& src, void* stream) const override { run(dst, src, src, 0, 0.0f, stream); }
  void add(const TensorView& dst, const TensorView& a, const TensorView& b, void* stream) const override {
    run(dst, a, b, 1, 0.0f, stream);
  }
  void fill(const TensorView& dst, float value, void* stream) const override { run(dst, dst, dst, 2, value, stream); }
  void merge(const TensorView& dst_out, const TensorView& dst_lse, const TensorView& out_acc, const TensorView& lse_acc,
             const TensorView& out, const TensorView& lse, void* stream) const override {
    // Padded to rank 4, the outputs' row dimensions 0..2 line up with the lse views' 1..3.
    const long long rows = lse_acc.numel();
    const long long head_dim = out_acc.shape[out_acc.rank - 1];
    if (rows == 0) return;
    const int threads = 256;
    const bool vec4 = aligned16(dst_out) && aligned16(out_acc) && aligned16(out) && rows_of(dst_out, 4) &&
                      rows_of(out_acc, 4) && rows_of(out, 4);
    merge_rows<<<blocks_for(rows * 32, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(
        view_of(dst_out, 4), view_of(dst_lse, 4), view_of(out_acc, 4), view_of(lse_acc, 4), view_of(out, 4),
        view_of(lse, 4), rows, head_dim, vec4);
    check(cudaGetLastError(), "merge kernel");
  }
  void divide_offsets(std::int32_t* dst, const std::int32_t* src, int count, int divisor, void* stream) const override {
    divide<<<(count + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, count, divisor);
    check(cudaGetLastError(), "offsets kernel");
  }

 private:
  static void run(const TensorView& dst, const TensorView& a, const TensorView& b, int op, float value, void* stream) {
    const long long n = dst.numel();
    if (n == 0) return;
    const int threads = 256;
    const bool flat = contiguous(dst) && contiguous(a) && contiguous(b);
    const bool aligned = aligned16(dst) && aligned16(a) && aligned16(b);
    if (aligned && ((flat && n % 8 == 0) || (rows_of(dst, 8) && rows_of(a, 8) && rows_of(b, 8))))
      elementwise8<<<blocks_for(n / 8, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(
          view_of(dst, 4), view_of(a, 4), view_of(b, 4), n, op, value, flat);
    else
      elementwise<<<blocks_for(n, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(
          view_of(dst, 4), view_of(a, 4), view_of(b, 4), n, op, value, flat);
    check(cudaGetLastError(), "elementwise kernel");
  }
};

}  // namespace

const DeviceOps& cuda_ops() {
  static const CudaOps ops;
  return ops;
}

}  // namespace flashattn::dist::detail
