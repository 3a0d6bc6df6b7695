#pragma once
// Timing for the command line and benchmarks: CUDA events on the GPU (L2 flushed before each
// run, as triton's do_bench does), a steady clock on the CPU; warm-up first, then the median of
// repeated runs.
#include <functional>

#include "flashattn/tensor.hpp"

namespace flashattn::host {

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int iterations = 0;
};

// Runs fn `warmup` times, then at least `min_iterations` times (or about 3 s) and at least
// `min_total_ms`.
Timing time_runs(DeviceKind device, const std::function<void()>& fn, int warmup = 3, int min_iterations = 10,
                 double min_total_ms = 200);

// Peak device memory the CUDA backend's stream-ordered allocations reached (bytes), and a reset.
std::size_t device_workspace_high_water();
void reset_device_workspace_high_water();
// Peak resident memory of this process (bytes).
std::size_t host_peak_rss();

}  // namespace flashattn::host
