// A KV-cache decoding step captured in a CUDA graph gives, replayed, exactly what the same call
// gives run eagerly: the append + rotary kernel, the split-KV attention and its combine are
// launched programmatically on Hopper (common/programmatic_launch.cuh), and serving engines
// replay decoding through graphs (ctest label `gpu`; skipped without a GPU, or when the CUDA
// backend was built without the kernel).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include "device_buffer.hpp"
#include "flashattn/error.hpp"
#include "flashattn/kv_cache.hpp"
#include "host_tensor.hpp"
#include "support/harness.hpp"

namespace flashattn::testing {
namespace {

using host::DeviceBuffer;
using host::HostTensor;

// A failed CUDA call ends the test (gtest reports the exception).
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.storage_bytes() == b.storage_bytes() && std::memcmp(a.data(), b.data(), a.storage_bytes()) == 0;
}

// What a device buffer holds, read back into a tensor laid out like `like`.
HostTensor read_back(const DeviceBuffer& buffer, const HostTensor& like) {
  HostTensor t(like.dtype(), like.shape());
  buffer.download(t);
  return t;
}

TEST(CudaGraph, KvCacheDecodeReplaysTheEagerResult) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int kBatch = 2, kHeads = 8, kHeadsKv = 2, kDim = 64, kCacheRows = 1000, kRotaryDim = 32;
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FLASHATTN_TEST_SEED reproduces it)");
  std::mt19937_64 rng(seed);
  auto random = [&](std::vector<std::int64_t> shape) {
    HostTensor t(DType::bf16, std::move(shape));
    t.fill_normal(rng);
    return t;
  };
  HostTensor q = random({kBatch, 1, kHeads, kDim}), cache = random({kBatch, kCacheRows, kHeadsKv, kDim});
  HostTensor k_new = random({kBatch, 1, kHeadsKv, kDim}), v_new = random({kBatch, 1, kHeadsKv, kDim});
  HostTensor cos = random({kCacheRows, kRotaryDim / 2}), sin = random({kCacheRows, kRotaryDim / 2});
  HostTensor seqlens(DType::i32, {kBatch});
  seqlens.set(0, 700);
  seqlens.set(1, kCacheRows - 1);
  HostTensor poisoned(DType::bf16, {kBatch, 1, kHeads, kDim});
  poisoned.poison();  // NaN, which no attention output is

  const DeviceBuffer d_q = DeviceBuffer::upload(q), d_k_new = DeviceBuffer::upload(k_new),
                     d_v_new = DeviceBuffer::upload(v_new), d_cos = DeviceBuffer::upload(cos),
                     d_sin = DeviceBuffer::upload(sin), d_seqlens = DeviceBuffer::upload(seqlens);
  // One cache and one output per way of running: eager, then the graph replayed twice.
  DeviceBuffer eager_k = DeviceBuffer::upload(cache), eager_v = DeviceBuffer::upload(cache),
               eager_out = DeviceBuffer::upload(poisoned);
  DeviceBuffer graph_k = DeviceBuffer::upload(cache), graph_v = DeviceBuffer::upload(cache),
               graph_out = DeviceBuffer::upload(poisoned);

  auto args_for = [&](DeviceBuffer& k, DeviceBuffer& v, DeviceBuffer& out, cudaStream_t stream) {
    KvCacheArgs a;
    a.q = q.view(DeviceKind::cuda, d_q.data());
    a.k_cache = cache.view(DeviceKind::cuda, k.data());
    a.v_cache = cache.view(DeviceKind::cuda, v.data());
    a.cache_seqlens = seqlens.view(DeviceKind::cuda, d_seqlens.data());
    a.k_new = k_new.view(DeviceKind::cuda, d_k_new.data());
    a.v_new = v_new.view(DeviceKind::cuda, d_v_new.data());
    a.rotary_cos = cos.view(DeviceKind::cuda, d_cos.data());
    a.rotary_sin = sin.view(DeviceKind::cuda, d_sin.data());
    a.out = poisoned.view(DeviceKind::cuda, out.data());
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
  const HostTensor eager = read_back(eager_out, poisoned);
  for (float x : eager.to_floats()) ASSERT_FALSE(std::isnan(x)) << "eager output left unwritten";

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  forward_kvcache(args_for(graph_k, graph_v, graph_out, stream));
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int replay = 0; replay < 2; ++replay) {  // the append writes the same rows each time
    check(cudaMemcpy(graph_out.data(), poisoned.data(), poisoned.storage_bytes(), cudaMemcpyHostToDevice), "poison");
    check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check(cudaStreamSynchronize(stream), "replay");
    EXPECT_TRUE(same_bytes(read_back(graph_out, poisoned), eager)) << "output, replay " << replay;
    EXPECT_TRUE(same_bytes(read_back(graph_k, cache), read_back(eager_k, cache))) << "k cache, replay " << replay;
    EXPECT_TRUE(same_bytes(read_back(graph_v, cache), read_back(eager_v, cache))) << "v cache, replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flashattn::testing
