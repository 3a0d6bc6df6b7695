// Development driver for the sm90 forward (not part of the suite; tests/ holds the real checks).
//
//   sm90_forward_smoke check [dtype]     shapes the shared table does not reach (long and ragged
//                                        sequences, every head dim, masks) against the float64
//                                        reference; exits 1 on a failure
//   sm90_forward_smoke small             one small causal GQA varlen call (for compute-sanitizer)
//   sm90_forward_smoke one d n causal [reps]
//                                        one benchmark shape, run reps times (for ncu)
//   sm90_forward_smoke time d n batch heads causal
//                                        one shape's median time and TFLOP/s (3 x 15 calls)
//   sm90_forward_smoke bench [dims] [families] [variants]
//                                        TFLOP/s at 16k tokens, hidden 2048 (b = 16384 / n,
//                                        h = 2048 / d), median of CUDA-event timings; e.g.
//                                        bench 64,128,256 sm90,sm80 0,1,2,3
// FLASHATTN_CUDA_FAMILY and FLASHATTN_SM90_SOFTMAX are set per measurement (dispatch.cu and
// forward_launch.cuh read them on every call).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "common/numeric.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "flashattn/reference.hpp"
#include "smoke_check.hpp"

using namespace flashattn;

namespace {

struct Shape {
  int batch = 1, heads_q = 2, heads_kv = 2, seqlen_q = 128, seqlen_k = 128, head_dim = 128;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  std::vector<int> lens_q, lens_k;  // variable length when set
  bool bhsd = false;                // q, k, v stored (batch, heads, seq, dim) (fixed length only)
  bool varlen() const { return !lens_q.empty(); }
  long long rows_q() const {
    if (!varlen()) return (long long)batch * seqlen_q;
    long long s = 0;
    for (int l : lens_q) s += l;
    return s;
  }
  long long rows_k() const {
    if (!varlen()) return (long long)batch * seqlen_k;
    long long s = 0;
    for (int l : lens_k) s += l;
    return s;
  }
  // LSE rows padded to 16 bytes (the GPU's stride rule): (batch, heads, pad) or (heads, pad).
  long long lse_pad() const { return ((varlen() ? rows_q() : seqlen_q) + 3) / 4 * 4; }
  long long lse_elements() const { return (varlen() ? 1 : batch) * (long long)heads_q * lse_pad(); }
  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "b=%d h=%d/%d sq=%d sk=%d d=%d%s%s%s w=%d,%d cap=%g", batch, heads_q,
                  heads_kv, seqlen_q, seqlen_k, head_dim, causal ? " causal" : "", varlen() ? " varlen" : "",
                  bhsd ? " bhsd" : "",
                  window_left, window_right, softcap);
    return buf;
  }
};

std::uint16_t to_bits(DType dt, float x) { return dt == DType::bf16 ? detail::float_to_bf16(x) : detail::float_to_half(x); }
float from_bits(DType dt, std::uint16_t b) { return dt == DType::bf16 ? detail::bf16_to_float(b) : detail::half_to_float(b); }

// Fills n 16-bit values with N(0, 1) draws (Box-Muller on a hash of the index): the same
// distribution as torch.randn, which the peers' figures were measured on (the power draw, and
// so the clock under the 700 W limit, depends on the data), and instant for 100M elements.
__device__ std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__global__ void fill_normal(std::uint16_t* out, long long n, std::uint32_t seed, bool bf16) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const std::uint32_t h1 = hash32(std::uint32_t(i) ^ hash32(seed ^ std::uint32_t(i >> 32)));
    const std::uint32_t h2 = hash32(h1 ^ 0x9e3779b9u);
    const float u1 = ((h1 >> 8) + 0.5f) * (1.0f / 16777216.0f), u2 = (h2 >> 8) * (1.0f / 16777216.0f);
    const float x = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    if (bf16) {
      out[i] = __bfloat16_as_ushort(__float2bfloat16(x));
    } else {
      out[i] = __half_as_ushort(__float2half(x));
    }
  }
}

// Device copies of one problem's tensors, contiguous (b, s, h, d) or packed (total, h, d).
struct Problem {
  Shape s;
  DType dtype;
  std::vector<float> q, k, v;  // inputs as the kernel sees them (rounded)
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float* dlse = nullptr;
  int *dcu_q = nullptr, *dcu_k = nullptr;
  std::vector<int> cu_q, cu_k;

  Problem(const Shape& shape, DType dt, std::uint64_t seed, bool keep_host) : s(shape), dtype(dt) {
    const long long nq = s.rows_q() * s.heads_q * s.head_dim, nk = s.rows_k() * s.heads_kv * s.head_dim;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto make = [&](long long n, std::vector<float>& host, void** dev) {
      if (!keep_host) {  // benchmark data: filled on the GPU
        CHECK_CUDA(cudaMalloc(dev, n * 2));
        fill_normal<<<1024, 256>>>(static_cast<std::uint16_t*>(*dev), n, std::uint32_t(rng()), dtype == DType::bf16);
        CHECK_CUDA(cudaGetLastError());
        return;
      }
      std::vector<std::uint16_t> bits(n);
      if (keep_host) host.resize(n);
      for (long long i = 0; i < n; ++i) {
        bits[i] = to_bits(dtype, normal(rng));
        if (keep_host) host[i] = from_bits(dtype, bits[i]);
      }
      CHECK_CUDA(cudaMalloc(dev, n * 2));
      CHECK_CUDA(cudaMemcpy(*dev, bits.data(), n * 2, cudaMemcpyHostToDevice));
    };
    make(nq, q, &dq);
    make(nk, k, &dk);
    make(nk, v, &dv);
    CHECK_CUDA(cudaMalloc(&dout, nq * 2));
    CHECK_CUDA(cudaMalloc(&dlse, s.lse_elements() * 4));
    if (s.varlen()) {
      cu_q = {0};
      cu_k = {0};
      for (int b = 0; b < s.batch; ++b) {
        cu_q.push_back(cu_q.back() + s.lens_q[b]);
        cu_k.push_back(cu_k.back() + s.lens_k[b]);
      }
      CHECK_CUDA(cudaMalloc(&dcu_q, cu_q.size() * 4));
      CHECK_CUDA(cudaMalloc(&dcu_k, cu_k.size() * 4));
      CHECK_CUDA(cudaMemcpy(dcu_q, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(dcu_k, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  ~Problem() {
    for (void* p : {dq, dk, dv, dout, (void*)dlse, (void*)dcu_q, (void*)dcu_k}) cudaFree(p);
  }

  void options(AttentionOptions& o) const {
    o.causal = s.causal;
    o.window_left = s.window_left;
    o.window_right = s.window_right;
    o.softcap = s.softcap;
  }

  TensorView qkv_view(void* data, DType dt, int heads, bool is_q, DeviceKind dev, bool input = true) const {
    const int d = s.head_dim;
    const std::int64_t n = is_q ? s.seqlen_q : s.seqlen_k;
    if (s.bhsd && input)
      return TensorView::strided(data, dt, {s.batch, n, heads, d}, {heads * n * d, d, n * d, 1}, dev);
    if (s.varlen())
      return TensorView::contiguous(data, dt, {is_q ? s.rows_q() : s.rows_k(), heads, d}, dev);
    return TensorView::contiguous(data, dt, {s.batch, is_q ? s.seqlen_q : s.seqlen_k, heads, d}, dev);
  }

  ForwardArgs args(DeviceKind dev, void* q_, void* k_, void* v_, void* out, float* lse, DType dt,
                   int* cu_q_, int* cu_k_) const {
    ForwardArgs a;
    options(a);
    a.q = qkv_view(q_, dt, s.heads_q, true, dev);
    a.k = qkv_view(k_, dt, s.heads_kv, false, dev);
    a.v = qkv_view(v_, dt, s.heads_kv, false, dev);
    a.out = qkv_view(out, dt, s.heads_q, true, dev, false);
    if (s.varlen()) {
      a.lse = TensorView::strided(lse, DType::f32, {s.heads_q, s.rows_q()}, {s.lse_pad(), 1}, dev);
      a.cu_seqlens_q = TensorView::contiguous(cu_q_, DType::i32, {s.batch + 1}, dev);
      a.cu_seqlens_k = TensorView::contiguous(cu_k_, DType::i32, {s.batch + 1}, dev);
      a.max_seqlen_q = s.seqlen_q;
      a.max_seqlen_k = s.seqlen_k;
    } else {
      a.lse = TensorView::strided(lse, DType::f32, {s.batch, s.heads_q, s.seqlen_q},
                                  {s.heads_q * s.lse_pad(), s.lse_pad(), 1}, dev);
    }
    return a;
  }

  void run_gpu() const { forward(args(DeviceKind::cuda, dq, dk, dv, dout, dlse, dtype, dcu_q, dcu_k)); }

  // The float64 reference on the rounded inputs, outputs in f32.
  void reference(std::vector<float>& out, std::vector<float>& lse) const {
    out.assign(q.size(), 0.f);
    lse.assign(s.lse_elements(), 0.f);
    std::vector<float> qq = q, kk = k, vv = v;
    std::vector<int> cq = cu_q, ck = cu_k;
    flashattn::reference::forward(args(DeviceKind::cpu, qq.data(), kk.data(), vv.data(), out.data(), lse.data(),
                                       DType::f32, cq.data(), ck.data()));
  }
};

struct CheckResult {
  double out_error = 0, lse_error = 0;
  long long unwritten = 0, masked_bad = 0;
};

CheckResult compare(const Problem& p, const std::vector<float>& ref_out, const std::vector<float>& ref_lse) {
  CheckResult r;
  std::vector<std::uint16_t> bits(ref_out.size());
  std::vector<float> lse(ref_lse.size());
  CHECK_CUDA(cudaMemcpy(bits.data(), p.dout, bits.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), p.dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < bits.size(); ++i) {
    const float o = from_bits(p.dtype, bits[i]);
    if (!std::isfinite(o)) ++r.unwritten;
    num += double(o - ref_out[i]) * (o - ref_out[i]);
    den += double(ref_out[i]) * ref_out[i];
  }
  r.out_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const int d = p.s.head_dim;
  const long long pad = p.s.lse_pad(), rows = p.s.varlen() ? p.s.rows_q() : p.s.seqlen_q;
  for (size_t i = 0; i < lse.size(); ++i) {
    const long long in_row = i % pad;
    if (in_row >= rows) continue;  // padding
    const long long head = (i / pad) % p.s.heads_q, b = i / pad / p.s.heads_q;
    const long long out_row = p.s.varlen() ? in_row : b * p.s.seqlen_q + in_row;  // row of out
    if (std::isnan(lse[i])) {
      ++r.unwritten;
      continue;
    }
    if (std::isinf(ref_lse[i])) {  // a row that sees no key: LSE -inf and output exactly 0
      if (!(std::isinf(lse[i]) && lse[i] < 0)) ++r.masked_bad;
      for (int c = 0; c < d; ++c)
        if (from_bits(p.dtype, bits[(out_row * p.s.heads_q + head) * d + c]) != 0.f) ++r.masked_bad;
      continue;
    }
    r.lse_error = std::max(r.lse_error, double(std::fabs(lse[i] - ref_lse[i])) / std::max(1.0, double(std::fabs(ref_lse[i]))));
  }
  return r;
}

std::vector<Shape> check_shapes() {
  std::vector<Shape> v;
  for (int d : {64, 96, 128, 192, 256}) {
    Shape s;
    s.head_dim = d;
    s.batch = 2;
    s.heads_q = 4;
    s.heads_kv = 2;
    s.seqlen_q = 1000;
    s.seqlen_k = 1100;
    v.push_back(s);
    s.causal = true;
    v.push_back(s);
    s.causal = false;
    s.seqlen_q = 777;
    s.seqlen_k = 333;
    s.window_left = 100;
    s.window_right = 30;
    v.push_back(s);
    Shape w;
    w.head_dim = d;
    w.batch = 5;
    w.heads_q = 3;
    w.heads_kv = 1;
    w.lens_q = {300, 1, 0, 257, 129};
    w.lens_k = {200, 700, 3, 0, 513};
    w.seqlen_q = 300;
    w.seqlen_k = 700;
    w.causal = true;
    v.push_back(w);
    Shape c;
    c.head_dim = d;
    c.seqlen_q = c.seqlen_k = 2048;
    c.causal = true;
    c.softcap = 20.f;
    v.push_back(c);
    Shape t;
    t.head_dim = d;
    t.batch = 3;
    t.heads_q = 2;
    t.heads_kv = 1;
    t.seqlen_q = 70;
    t.seqlen_k = 390;
    t.bhsd = true;
    t.window_left = 200;
    t.window_right = -1;
    v.push_back(t);
  }
  return v;
}

bool built_head_dim(int d, DType dt) {
  // A call on a 1-row problem tells whether this build has the instance (sm90 forced).
  Shape s;
  s.head_dim = d;
  s.seqlen_q = s.seqlen_k = 1;
  Problem p(s, dt, 1, false);
  try {
    p.run_gpu();
    CHECK_CUDA(cudaDeviceSynchronize());
    return true;
  } catch (const Error&) {
    return false;
  }
}

int run_checks(DType dt) {
  setenv("FLASHATTN_CUDA_FAMILY", "sm90", 1);
  std::vector<Shape> shapes;
  for (const Shape& s : check_shapes())
    if (built_head_dim(s.head_dim, dt)) shapes.push_back(s);
  // References on all cores at once; the GPU runs meanwhile.
  std::vector<std::unique_ptr<Problem>> problems;
  std::vector<std::future<std::pair<std::vector<float>, std::vector<float>>>> refs;
  std::uint64_t seed = std::random_device{}();
  std::printf("check seed %llu\n", (unsigned long long)seed);
  for (const Shape& s : shapes) {
    problems.push_back(std::make_unique<Problem>(s, dt, seed++, true));
    const Problem* p = problems.back().get();
    refs.push_back(std::async(std::launch::async, [p] {
      std::pair<std::vector<float>, std::vector<float>> r;
      p->reference(r.first, r.second);
      return r;
    }));
  }
  int failures = 0;
  const double tol = dt == DType::bf16 ? 1.2e-2 : 2.5e-3;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Problem& p = *problems[i];
    CHECK_CUDA(cudaMemset(p.dout, 0xff, p.s.rows_q() * p.s.heads_q * p.s.head_dim * 2));
    CHECK_CUDA(cudaMemset(p.dlse, 0xff, p.s.lse_elements() * 4));
    p.run_gpu();
    CHECK_CUDA(cudaDeviceSynchronize());
    auto [ref_out, ref_lse] = refs[i].get();
    const CheckResult r = compare(p, ref_out, ref_lse);
    const bool ok = r.out_error <= tol && r.lse_error <= 1e-3 && r.unwritten == 0 && r.masked_bad == 0;
    failures += !ok;
    std::printf("%-4s %-62s out_err %.2e lse_err %.2e unwritten %lld masked_bad %lld\n", ok ? "ok" : "FAIL",
                shapes[i].describe().c_str(), r.out_error, r.lse_error, r.unwritten, r.masked_bad);
  }
  std::printf("check %s: %d of %zu failed\n", to_string(dt), failures, shapes.size());
  return failures ? 1 : 0;
}

int run_small() {
  Shape s;
  s.head_dim = 128;
  s.batch = 3;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.lens_q = {130, 7, 0};
  s.lens_k = {200, 0, 50};
  s.seqlen_q = 130;
  s.seqlen_k = 200;
  s.causal = true;
  Problem p(s, DType::bf16, 7, false);
  p.run_gpu();
  Shape f;
  f.head_dim = 128;
  f.batch = 2;
  f.seqlen_q = 300;
  f.seqlen_k = 260;
  f.window_left = 64;
  f.window_right = 8;
  Problem q(f, DType::bf16, 8, false);
  q.run_gpu();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("small: done\n");
  return 0;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// As triton.testing.do_bench (the peers' figures): before each timed call, a 256 MB memset
// clears L2 and keeps the GPU busy while the host enqueues the call, so that the events time
// the GPU work alone (the host's own time per call is reported separately).
void* flush_buffer() {
  static void* buffer = [] {
    void* b = nullptr;
    CHECK_CUDA(cudaMalloc(&b, 256u << 20));
    return b;
  }();
  return buffer;
}

double median_ms(const Problem& p, int reps) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) p.run_gpu();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaMemsetAsync(flush_buffer(), 0, 256u << 20));
    CHECK_CUDA(cudaEventRecord(a));
    p.run_gpu();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median_of(t);
}

// Host time of one call (validation, descriptors, launch), measured while the GPU is busy.
double host_us_per_call(const Problem& p) {
  std::vector<double> t;
  for (int i = 0; i < 20; ++i) {
    CHECK_CUDA(cudaMemsetAsync(flush_buffer(), 0, 256u << 20));
    const auto start = std::chrono::steady_clock::now();
    p.run_gpu();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  return median_of(t);
}

// Keeps the GPU busy for about `ms` so that clocks settle before timings, on a head dim the
// bench measures (a narrowed build may have no other).
void warm_up(double ms, int head_dim) {
  Shape s;
  s.head_dim = head_dim;
  s.batch = 2;
  s.heads_q = s.heads_kv = 2048 / head_dim;
  s.seqlen_q = s.seqlen_k = 8192;
  Problem p(s, DType::bf16, 5, false);
  const double one = median_ms(p, 3);
  for (int i = 0; i < int(ms / one); ++i) p.run_gpu();
  CHECK_CUDA(cudaDeviceSynchronize());
}

// Every (family, variant) of one shape is timed in turn, three times over, and each gets the
// median of its three medians: slow drifts of the clock hit all of them alike.
int run_bench(const std::string& dims, const std::string& families, const std::string& variants) {
  const int first_dim = std::atoi(split(dims).front().c_str());
  warm_up(1500, first_dim);
  {
    Shape s;
    s.head_dim = first_dim;
    s.batch = 16;
    s.heads_q = s.heads_kv = 2048 / first_dim;
    s.seqlen_q = s.seqlen_k = 1024;
    Problem p(s, DType::bf16, 3, false);
    std::printf("host time per call (d=%d n=1k): %.1f us\n", first_dim, host_us_per_call(p));
  }
  std::printf("%-6s %-4s %-6s %-6s %-7s %-8s %10s %9s\n", "family", "d", "n", "causal", "variant", "b x h", "ms", "TFLOP/s");
  for (const std::string& ds : split(dims)) {
    const int d = std::atoi(ds.c_str());
    for (int n : {1024, 2048, 4096, 8192, 16384}) {
      Shape shape;
      shape.head_dim = d;
      shape.seqlen_q = shape.seqlen_k = n;
      shape.batch = 16384 / n;
      shape.heads_q = shape.heads_kv = 2048 / d;
      Problem p(shape, DType::bf16, 1234, false);
      for (bool causal : {false, true}) {
        p.s.causal = causal;
        const Shape& s = p.s;
        const double flops = 4.0 * s.batch * s.heads_q * double(n) * n * d * (causal ? 0.5 : 1.0);
        std::vector<std::pair<std::string, std::string>> configs;
        for (const std::string& fam : split(families))
          for (const std::string& var : fam == "sm90" ? split(variants) : std::vector<std::string>{"-"})
            configs.push_back({fam, var});
        std::vector<std::vector<double>> times(configs.size());
        std::vector<std::string> errors(configs.size());
        for (int pass = 0; pass < 3; ++pass) {
          for (size_t i = 0; i < configs.size(); ++i) {
            if (!errors[i].empty()) continue;
            setenv("FLASHATTN_CUDA_FAMILY", configs[i].first.c_str(), 1);
            if (configs[i].second != "-") setenv("FLASHATTN_SM90_SOFTMAX", configs[i].second.c_str(), 1);
            try {
              times[i].push_back(median_ms(p, n >= 8192 ? 7 : 15));
            } catch (const Error& e) {
              errors[i] = e.what();
            }
          }
        }
        for (size_t i = 0; i < configs.size(); ++i) {
          if (!errors[i].empty()) {
            std::printf("%-6s %-4d %-6d %-6s %-7s skipped: %s\n", configs[i].first.c_str(), d, n, causal ? "yes" : "no",
                        configs[i].second.c_str(), errors[i].c_str());
            continue;
          }
          const double ms = median_of(times[i]);
          std::printf("%-6s %-4d %-6d %-6s %-7s %3dx%-4d %10.3f %9.1f\n", configs[i].first.c_str(), d, n,
                      causal ? "yes" : "no", configs[i].second.c_str(), s.batch, s.heads_q, ms, flops / ms * 1e-9);
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  try {
    if (mode == "check") return run_checks(argc > 2 && std::strcmp(argv[2], "f16") == 0 ? DType::f16 : DType::bf16);
    if (mode == "small") return run_small();
    if (mode == "one" && argc > 4) {
      Shape s;
      s.head_dim = std::atoi(argv[2]);
      s.seqlen_q = s.seqlen_k = std::atoi(argv[3]);
      s.batch = 16384 / s.seqlen_q;
      s.heads_q = s.heads_kv = 2048 / s.head_dim;
      s.causal = std::atoi(argv[4]) != 0;
      Problem p(s, DType::bf16, 99, false);
      const int reps = argc > 5 ? std::atoi(argv[5]) : 5;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) p.run_gpu();
      CHECK_CUDA(cudaDeviceSynchronize());
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / reps;
      const double flops = 4.0 * s.batch * s.heads_q * double(s.seqlen_q) * s.seqlen_k * s.head_dim * (s.causal ? 0.5 : 1.0);
      std::printf("one: %s x%d, %.3f ms per call back to back (%.1f TFLOP/s)\n", s.describe().c_str(), reps, ms,
                  flops / ms * 1e-9);
      return 0;
    }
    if (mode == "time" && argc > 6) {
      Shape s;
      s.head_dim = std::atoi(argv[2]);
      s.seqlen_q = s.seqlen_k = std::atoi(argv[3]);
      s.batch = std::atoi(argv[4]);
      s.heads_q = s.heads_kv = std::atoi(argv[5]);
      s.causal = std::atoi(argv[6]) != 0;
      Problem p(s, DType::bf16, 7, false);
      warm_up(500, s.head_dim);
      std::vector<double> times;
      for (int pass = 0; pass < 3; ++pass) times.push_back(median_ms(p, 15));
      const double ms = median_of(times);
      const double flops = 4.0 * s.batch * s.heads_q * double(s.seqlen_q) * s.seqlen_k * s.head_dim *
                           (s.causal ? 0.5 : 1.0);
      std::printf("time: %s %.4f ms %.1f TFLOP/s\n", s.describe().c_str(), ms, flops / ms * 1e-9);
      return 0;
    }
    if (mode == "bench")
      return run_bench(argc > 2 ? argv[2] : "128", argc > 3 ? argv[3] : "sm90", argc > 4 ? argv[4] : "0");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  std::fprintf(stderr,
               "usage: %s check [bf16|f16] | small | one d n causal [reps] | time d n batch heads causal | "
               "bench [dims] [families] [variants]\n",
               argv[0]);
  return 2;
}
