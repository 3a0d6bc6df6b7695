#pragma once
// Context-parallel attention: one attention problem whose sequence is split over the ranks of a
// communicator (one process or thread per GPU). Two strategies, forward and backward:
//
//  - ring: each rank keeps its query shard; K/V shards travel around the ring (rank r sends to
//    r + 1, receives from r - 1), the transfer of the next block in flight while the current
//    one is computed; partial outputs merge through their LSE. The backward sends K/V around
//    again, and with them float32 dK/dV accumulators that come home while the rank computes
//    the last of its own blocks.
//  - all_to_all (head-parallel, DeepSpeed-Ulysses): one all-to-all turns sequence-sharded
//    Q/K/V into head-sharded full sequences, the single-device attention runs, a second one
//    turns the output back; the backward the same way.
//
// Sharding ("zigzag"): the global sequence (of every document, with variable lengths) is cut
// into 2 * size equal chunks; rank r holds chunks r and 2 * size - 1 - r, in that order, so every
// rank has the same causal work. Fixed-length: q (batch, 2c, heads, head_dim) on every rank,
// the global length 2c * size. Variable length (cu_seqlens): every document's length is a
// multiple of 2 * size; the rank's packed tensor holds chunk r of every document (in document
// order), then chunk 2 * size - 1 - r of every document; cu_seqlens_q/k passed to these functions
// are the GLOBAL offsets (the same on every rank) and max_seqlen_q/k the global longest document.
// The Python helpers flashattn.distributed.shard/unshard cut and reassemble tensors this way.
//
// What crosses ranks: f16/bf16 (and f32 on the CPU), causal or not, GQA/MQA, variable length,
// softcap, softmax_scale. Sliding windows are rejected (a window needs only a few neighbours,
// not a ring). Self-attention only: q and k have the same (sharded) length.
//
// The transfers go through a Communicator: NCCL on GPUs (make_nccl_communicator), or any other
// transport (threads in one process, torch.distributed through the Python bindings) for CPU
// tensors. Every rank must call the same function with the same shapes and options at the same
// time. GPU calls run on args.stream, transfers on the communicator's own stream, ordered by
// CUDA events; nothing synchronizes the host. Arguments are validated before anything runs:
// flashattn::Error, nothing written. (A failure on one rank mid-call cannot be undone on the
// others; a transport error is reported as ErrorKind::runtime.)
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "flashattn/attention.hpp"

namespace flashattn::dist {

// A span of bytes the communicator sends or receives.
struct Buffer {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// The transport the algorithms run over. Implementations: NCCL (GPU), threads in one process
// (make_thread_communicators), and the Python bindings' torch.distributed one.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device the buffers live on (CPU transports: DeviceKind::cpu).
  virtual DeviceKind device() const = 0;

  // Starts sending `send` (in order) to rank `to` and receiving `recv` (in order, the same sizes
  // the sender sends) from rank `from`; returns a ticket for finish_exchange. On a GPU the
  // transfer starts after the work queued on `stream` so far, and `stream` goes on without
  // waiting for its end. (The NCCL communicator holds `stream` back only until the transfer's
  // kernel is next in line on its own stream, so that the kernel is placed on the GPU before the
  // attention kernels queued next: an exchange started while another is in flight makes
  // `stream` wait for that one.) Every exchange started must be finished, in any order.
  virtual int start_exchange(const std::vector<Buffer>& send, int to, const std::vector<Buffer>& recv,
                             int from, void* stream) = 0;
  // Work queued on `stream` afterwards (on the CPU: the caller) sees the received data, and
  // the sent buffers may be overwritten.
  virtual void finish_exchange(int ticket, void* stream) = 0;
  // send[j] goes to rank j, recv[j] comes from rank j (j = this rank copies); `size()` entries
  // each. Ordered on `stream` like an exchange started and finished at once.
  virtual void all_to_all(const std::vector<Buffer>& send, const std::vector<Buffer>& recv, void* stream) = 0;
};

// `size` communicators over threads of this process (CPU tensors): rank i's calls must run on
// their own thread. For tests and for trying the algorithms without a cluster.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size);

// For measuring how much transfer time the algorithms leave exposed: a communicator of `size`
// ranks that transfers nothing between ranks: each received buffer gets a local copy of the
// buffer sent in its place (the results are wrong, the data realistic), so that a call over it
// costs the compute alone (plus those local copies). `device`: the tensors' device kind.
std::unique_ptr<Communicator> make_null_communicator(int rank, int size, DeviceKind device);

// Whether this build has the NCCL transport (CMake found NCCL beside the CUDA backend).
bool built_with_nccl() noexcept;
// NCCL's unique id (ncclGetUniqueId) as bytes: rank 0 makes it and hands it to every rank
// (through MPI, a file, torch.distributed's broadcast, ...).
std::vector<std::uint8_t> nccl_unique_id();
// A communicator over a new NCCL communicator (ncclCommInitRank) on CUDA device `device`, with its
// own transfer stream. Throws ErrorKind::unsupported without NCCL in the build.
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<std::uint8_t>& unique_id, int rank,
                                                     int size, int device);

enum class Strategy : std::uint8_t { ring, all_to_all };
const char* to_string(Strategy strategy) noexcept;

// Forward / backward of the attention whose shards the ranks hold. The arguments are those of
// flashattn::forward/backward over this rank's shards (lse: the rank's rows, as the
// single-device call lays them out for the local tensors; for variable length (heads_q,
// local_total)). Backward: dq, dk, dv are this rank's shards of the full gradients.
void forward(const ForwardArgs& args, Communicator& comm, Strategy strategy = Strategy::ring);
void backward(const BackwardArgs& args, Communicator& comm, Strategy strategy = Strategy::ring);

}  // namespace flashattn::dist
