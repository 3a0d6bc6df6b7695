// A KV-cache decoding step captured in a CUDA graph gives, replayed, exactly what the same call
// gives run eagerly: the append + rotary kernel, the split-KV attention and its combine are
// launched programmatically on Hopper (common/programmatic_launch.cuh), and serving engines
// replay decoding through graphs (ctest label `gpu`; skipped without a GPU, or when the CUDA
// backend was built without the kernel).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/kv_cache.hpp"
#include "support/harness.hpp"

namespace flashattn::testing {
namespace {

// A failed CUDA call ends the test (gtest reports the exception).
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// A device buffer holding a copy of `host`, freed with the test.
struct DeviceCopy {
  void* data = nullptr;
  std::size_t bytes = 0;
  template <class T>
  explicit DeviceCopy(const std::vector<T>& host) : bytes(host.size() * sizeof(T)) {
    EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(data); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  std::vector<std::uint8_t> read() const {
    std::vector<std::uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

// bf16 values in [-1, 1) from a linear congruential stream (the upper half of a float's bits).
std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const float f = float(seed >> 40) / float(1 << 24) * 2.0f - 1.0f;
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = std::uint16_t(bits >> 16);
  }
  return v;
}

TEST(CudaGraph, KvCacheDecodeReplaysTheEagerResult) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int kBatch = 2, kHeads = 8, kHeadsKv = 2, kDim = 64, kCacheRows = 1000, kRotaryDim = 32;
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FLASHATTN_TEST_SEED reproduces it)");
  const auto cache = random_bf16(std::size_t(kBatch) * kCacheRows * kHeadsKv * kDim, seed);
  const auto q = random_bf16(std::size_t(kBatch) * kHeads * kDim, seed + 1);
  const auto k_new = random_bf16(std::size_t(kBatch) * kHeadsKv * kDim, seed + 2);
  const auto v_new = random_bf16(std::size_t(kBatch) * kHeadsKv * kDim, seed + 3);
  const auto cos = random_bf16(std::size_t(kCacheRows) * kRotaryDim / 2, seed + 4);
  const auto sin = random_bf16(std::size_t(kCacheRows) * kRotaryDim / 2, seed + 5);
  const std::vector<std::int32_t> seqlens{700, kCacheRows - 1};
  const std::vector<std::uint16_t> poison(std::size_t(kBatch) * kHeads * kDim, 0xffff);  // NaN

  DeviceCopy d_q(q), d_k_new(k_new), d_v_new(v_new), d_cos(cos), d_sin(sin), d_seqlens(seqlens);
  // One cache and one output per way of running: eager, then the graph replayed twice.
  DeviceCopy eager_k(cache), eager_v(cache), eager_out(poison);
  DeviceCopy graph_k(cache), graph_v(cache), graph_out(poison);

  auto args_for = [&](DeviceCopy& k, DeviceCopy& v, DeviceCopy& out, cudaStream_t stream) {
    const auto view = [](void* p, DType t, std::initializer_list<std::int64_t> shape) {
      return TensorView::contiguous(p, t, shape, DeviceKind::cuda);
    };
    KvCacheArgs a;
    a.q = view(d_q.data, DType::bf16, {kBatch, 1, kHeads, kDim});
    a.k_cache = view(k.data, DType::bf16, {kBatch, kCacheRows, kHeadsKv, kDim});
    a.v_cache = view(v.data, DType::bf16, {kBatch, kCacheRows, kHeadsKv, kDim});
    a.cache_seqlens = view(d_seqlens.data, DType::i32, {kBatch});
    a.k_new = view(d_k_new.data, DType::bf16, {kBatch, 1, kHeadsKv, kDim});
    a.v_new = view(d_v_new.data, DType::bf16, {kBatch, 1, kHeadsKv, kDim});
    a.rotary_cos = view(d_cos.data, DType::bf16, {kCacheRows, kRotaryDim / 2});
    a.rotary_sin = view(d_sin.data, DType::bf16, {kCacheRows, kRotaryDim / 2});
    a.out = view(out.data, DType::bf16, {kBatch, 1, kHeads, kDim});
    a.causal = true;
    a.num_splits = 4;  // the split-KV kernel and its combine
    a.stream = stream;
    return a;
  };

  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  try {
    forward_kvcache(args_for(eager_k, eager_v, eager_out, stream));
  } catch (const Error& e) {
    cudaStreamDestroy(stream);
    if (e.kind() == ErrorKind::unsupported) GTEST_SKIP() << e.what();
    throw;
  }
  check(cudaStreamSynchronize(stream), "eager call");
  {  // the eager call wrote every output element (the poison is a NaN no attention gives)
    const auto bytes = eager_out.read();
    std::vector<std::uint16_t> out(bytes.size() / 2);
    std::memcpy(out.data(), bytes.data(), bytes.size());
    ASSERT_EQ(std::count(out.begin(), out.end(), std::uint16_t(0xffff)), 0) << "eager output left unwritten";
  }

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  forward_kvcache(args_for(graph_k, graph_v, graph_out, stream));
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int replay = 0; replay < 2; ++replay) {  // the append writes the same rows each time
    check(cudaMemcpyAsync(graph_out.data, poison.data(), graph_out.bytes, cudaMemcpyHostToDevice, stream), "poison");
    check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check(cudaStreamSynchronize(stream), "replay");
    EXPECT_EQ(graph_out.read(), eager_out.read()) << "output, replay " << replay;
    EXPECT_EQ(graph_k.read(), eager_k.read()) << "k cache, replay " << replay;
    EXPECT_EQ(graph_v.read(), eager_v.read()) << "v cache, replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flashattn::testing
