// DeviceOps on CUDA: stream-ordered allocation and small memory-bound kernels over strided views
// of rank <= 4 (the dtypes are runtime arguments: these kernels move a few bytes per FLOP of
// the attention they sit beside, and one instance serves every dtype).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "dist/ops.hpp"
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

// op 0: dst = src; 1: dst += src; 2: dst = value. `flat`: both views are row-major contiguous, so
// an element's offset is its index (the common case: workspace and whole-tensor copies).
__global__ void elementwise(View dst, View src, long long n, int op, float value, bool flat) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    if (flat) {
      if (op == 2)
        store(dst, i, value);
      else
        store(dst, i, op == 1 ? load(dst, i) + load(src, i) : load(src, i));
      continue;
    }
    const long long d = offset(dst, i);
    if (op == 2)
      store(dst, d, value);
    else {
      const float x = load(src, offset(src, i));
      store(dst, d, op == 1 ? load(dst, d) + x : x);
    }
  }
}

// One warp per row (a grid-stride loop over rows): rows are indexed by the lse views (padded to
// rank 4: dims 1..3), the head dimension is the outputs' last; out dim d - 1 pairs with lse dim d.
__global__ void merge_rows(View out_acc, View lse_acc, View out, View lse, long long rows, long long head_dim) {
  const int lane = threadIdx.x % 32;
  const long long warps = (long long)gridDim.x * blockDim.x / 32;
  float* lacc = reinterpret_cast<float*>(lse_acc.data);
  float* acc = reinterpret_cast<float*>(out_acc.data);
  const long long sa = out_acc.stride[3], so = out.stride[3];
  for (long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; row < rows; row += warps) {
    long long oa = 0, os = 0, la = 0, ls = 0, i = row;
    for (int d = 3; d >= 1; --d) {
      const long long idx = i % lse_acc.shape[d];
      i /= lse_acc.shape[d];
      la += idx * lse_acc.stride[d];
      ls += idx * lse.stride[d];
      oa += idx * out_acc.stride[d - 1];
      os += idx * out.stride[d - 1];
    }
    const float a = lacc[la], s = reinterpret_cast<const float*>(lse.data)[ls];
    const float m = fmaxf(a, s);
    if (m == -INFINITY) continue;  // the whole warp: the row is the same for every lane
    const float wa = expf(a - m), ws = expf(s - m), total = wa + ws;
    const float ca = wa / total, cs = ws / total;
    for (long long j = lane; j < head_dim; j += 32) acc[oa + j * sa] = acc[oa + j * sa] * ca + load(out, os + j * so) * cs;
    __syncwarp();
    if (lane == 0) lacc[la] = m + logf(total);
    __syncwarp();
  }
}

__global__ void divide(std::int32_t* dst, const std::int32_t* src, int count, int divisor) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = src[i] / divisor;
}

bool row_major(const TensorView& t) {
  std::int64_t expected = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.stride[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

int blocks_for(long long n, int threads) {
  const long long b = (n + threads - 1) / threads;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

class CudaOps final : public DeviceOps {
 public:
  void* allocate(std::size_t bytes, void* stream) const override {
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes > 0 ? bytes : 1, static_cast<cudaStream_t>(stream)), "cudaMallocAsync");
    return p;
  }
  void release(void* data, void* stream) const override { cudaFreeAsync(data, static_cast<cudaStream_t>(stream)); }
  void copy(const TensorView& dst, const TensorView& src, void* stream) const override { run(dst, src, 0, 0.0f, stream); }
  void add(const TensorView& dst, const TensorView& src, void* stream) const override { run(dst, src, 1, 0.0f, stream); }
  void fill(const TensorView& dst, float value, void* stream) const override { run(dst, dst, 2, value, stream); }
  void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out, const TensorView& lse,
             void* stream) const override {
    const View oa = view_of(out_acc, 4), o = view_of(out, 4);
    const View la = view_of(lse_acc, 4), l = view_of(lse, 4);
    // Padded to rank 4, the outputs' row dimensions 0..2 line up with the lse views' 1..3.
    const long long rows = lse_acc.numel();
    const long long head_dim = out_acc.shape[out_acc.rank - 1];
    if (rows == 0) return;
    const int threads = 256;
    merge_rows<<<blocks_for(rows * 32, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(oa, la, o, l, rows,
                                                                                                  head_dim);
    check(cudaGetLastError(), "merge kernel");
  }
  void divide_offsets(std::int32_t* dst, const std::int32_t* src, int count, int divisor, void* stream) const override {
    divide<<<(count + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, count, divisor);
    check(cudaGetLastError(), "offsets kernel");
  }

 private:
  static void run(const TensorView& dst, const TensorView& src, int op, float value, void* stream) {
    const long long n = dst.numel();
    if (n == 0) return;
    const int threads = 256;
    elementwise<<<blocks_for(n, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(view_of(dst, 4), view_of(src, 4),
                                                                                           n, op, value,
                                                                                           row_major(dst) && row_major(src));
    check(cudaGetLastError(), "elementwise kernel");
  }
};

}  // namespace

const DeviceOps& cuda_ops() {
  static const CudaOps ops;
  return ops;
}

}  // namespace flashattn::dist::detail
