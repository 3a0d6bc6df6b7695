// flashattn::dist on the CPU: every rank a thread (make_thread_communicators), the ring and the
// all-to-all against one single-process call of the same CPU backend on the whole sequence:
// outputs, LSE and all three gradients, on zigzag shards (include/flashattn/distributed.hpp).
#include "distributed_check.hpp"

namespace {

using namespace flashattn;
using namespace flashattn::testing::distributed;

class CpuThreads final : public Placement {
 public:
  void prepare(int ranks) override { comms_ = dist::make_thread_communicators(ranks); }
  std::unique_ptr<dist::Communicator> join(int r) override { return std::move(comms_[r]); }
  TensorView put(Host& h, int) override { return h.view(); }
  void get(Host&, const TensorView&, int) override {}
  void* stream(int) override { return nullptr; }
  void sync(int) override {}

 private:
  std::vector<std::unique_ptr<dist::Communicator>> comms_;
};

void run_case(const Config& c) {
  CpuThreads place;
  flashattn::testing::distributed::run_case(c, place);
}

TEST(Distributed, RingFixedLength) {
  for (int R : {1, 2, 3, 4})
    for (bool causal : {true, false}) {
      Config c;
      c.ranks = R, c.causal = causal;
      c.chunk = R == 3 ? 5 : 4;
      run_case(c);
    }
}

TEST(Distributed, RingGqaSoftcapBf16) {
  Config c;
  c.heads_q = 8, c.heads_kv = 1, c.softcap = 5.0f, c.chunk = 17, c.batch = 2;
  run_case(c);
  c.dtype = DType::bf16;
  run_case(c);
  c.dtype = DType::f16;
  c.ranks = 3;
  run_case(c);
}

TEST(Distributed, RingVariableLength) {
  for (int R : {2, 4})
    for (bool causal : {true, false}) {
      Config c;
      c.ranks = R, c.causal = causal, c.varlen = true;
      c.documents = {4 * R, 2 * R, 10 * R, 0, 2 * R};
      run_case(c);
    }
}

// K and V that are not contiguous: the ring sends a contiguous copy (contiguous ones go out as
// they are), and the all-to-all gathers from the strided views.
TEST(Distributed, StridedKeysAndValues) {
  for (int R : {2, 3})
    for (auto strategy : {dist::Strategy::ring, dist::Strategy::all_to_all}) {
      if (strategy == dist::Strategy::all_to_all && R == 3) continue;  // heads_q over 3 ranks
      Config c;
      c.ranks = R, c.strategy = strategy, c.strided_kv = true, c.heads_q = 4, c.heads_kv = 2;
      run_case(c);
    }
}

TEST(Distributed, AllToAll) {
  for (int R : {1, 2, 4})
    for (bool causal : {true, false}) {
      Config c;
      c.strategy = dist::Strategy::all_to_all;
      c.ranks = R, c.causal = causal, c.heads_q = 8, c.heads_kv = 2;  // R = 4: heads_kv < ranks
      run_case(c);
    }
  Config c;
  c.strategy = dist::Strategy::all_to_all;
  c.heads_q = 4, c.heads_kv = 4, c.softcap = 3.0f, c.dtype = DType::bf16, c.chunk = 9;
  run_case(c);
}

TEST(Distributed, RejectsBadArguments) {
  auto comms = dist::make_thread_communicators(1);
  Host q(DType::f32, {1, 6, 2, 16}), out(DType::f32, {1, 6, 2, 16});
  ForwardArgs f;
  f.q = f.k = f.v = q.view();
  f.out = out.view();
  f.window_left = 2;
  EXPECT_THROW(dist::forward(f, *comms[0]), Error);
  f.window_left = -1;
  Host odd(DType::f32, {1, 5, 2, 16}), odd_out(DType::f32, {1, 5, 2, 16});
  ForwardArgs g;
  g.q = g.k = g.v = odd.view();
  g.out = odd_out.view();
  try {
    dist::forward(g, *comms[0]);
    ADD_FAILURE() << "odd shard accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q");
  }
  Host q3(DType::f32, {1, 6, 3, 16}), o3(DType::f32, {1, 6, 3, 16});
  auto two = dist::make_thread_communicators(2);
  ForwardArgs h;
  h.q = h.k = h.v = q3.view();
  h.out = o3.view();
  EXPECT_THROW(dist::forward(h, *two[0], dist::Strategy::all_to_all), Error);  // 3 heads over 2 ranks
  EXPECT_FALSE(dist::built_with_nccl() && !flashattn::built_with_cuda());
}

// The compute-alone transport gives every received buffer the bytes sent in its place (so that
// benchmarks over it compute on real data), and sends nothing anywhere.
TEST(Distributed, NullCommunicatorStandsInWithTheSentBytes) {
  auto comm = dist::make_null_communicator(1, 4, DeviceKind::cpu);
  std::vector<std::uint8_t> a(40), b(24), x(40, 0xEE), y(24, 0xEE), z(8, 0xEE);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::uint8_t(i + 1);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::uint8_t(200 - i);
  const int ticket = comm->start_exchange({{a.data(), a.size()}, {b.data(), b.size()}}, 2,
                                          {{x.data(), x.size()}, {y.data(), y.size()}}, 0, nullptr);
  comm->finish_exchange(ticket, nullptr);
  EXPECT_EQ(x, a);
  EXPECT_EQ(y, b);
  comm->all_to_all({{a.data(), 8}}, {{z.data(), z.size()}}, nullptr);
  EXPECT_EQ(z, std::vector<std::uint8_t>(a.begin(), a.begin() + 8));
}

}  // namespace
