// Work sharing over XLA's intra-op thread pool for the kernels of this package.
#ifndef JAXRL_FRONTIER_KERNELS_PARALLEL_FOR_H_
#define JAXRL_FRONTIER_KERNELS_PARALLEL_FOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace jaxrl_frontier {

// Runs work(i) for every i in [0, items), on the calling thread and on up to `helpers`
// threads of XLA's pool. Each thread that finds an item left first calls make_worker() once
// (per-thread scratch lives in the worker it returns), then claims items from a shared
// counter. The caller waits only for items already claimed, never for a helper that has not
// started, so a busy pool cannot deadlock it; a helper holds only values and the shared
// counters, so one that starts after the call returned finds no item left and exits.
template <typename MakeWorker>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t items, int64_t helpers,
                 MakeWorker make_worker) {
  struct Progress {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto progress = std::make_shared<Progress>();
  auto drain = [progress, items, make_worker]() {
    int64_t i = progress->next.fetch_add(1);
    if (i >= items) return;
    auto work = make_worker();
    for (; i < items; i = progress->next.fetch_add(1)) {
      work(i);
      progress->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([drain]() { drain(); });
  drain();
  while (progress->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
}

}  // namespace jaxrl_frontier

#endif  // JAXRL_FRONTIER_KERNELS_PARALLEL_FOR_H_
