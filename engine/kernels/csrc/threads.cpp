#include "threads.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EXO_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define EXO_PAUSE() asm volatile("yield")
#else
#define EXO_PAUSE() ((void)0)
#endif

namespace exo_kernels {
namespace {

// A worker spins this many rounds for the next job before it sleeps: in a decoding step the
// matmuls come tens of microseconds apart, and waking a sleeping thread costs about that much.
constexpr int SPIN_ROUNDS = 20000;
// Jobs that read less than this run on the calling thread alone. On two cores the decoding
// step of a small model ran faster with every job on one thread (bench/batching.py).
constexpr std::size_t MIN_PARALLEL_BYTES = 384 * 1024;

// One round of a spin-wait. Every few rounds the core goes to any other thread that is ready to
// run: on two cores a spinning worker otherwise keeps the model's Python thread, the API's event
// loop or a client off a core (bench/api.py: the demo's streams ran faster with it), and
// a thread with nothing else to run is back from sched_yield in about a microsecond.
inline void relax(int spins) {
  EXO_PAUSE();
  if (spins % 16 == 0) sched_yield();
}

int default_threads() {
  if (const char* env = std::getenv("EXO_TUI_KERNEL_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  if (const char* env = std::getenv("OPENBLAS_NUM_THREADS")) {  // ranks sharing a machine
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

class Pool {
 public:
  explicit Pool(int threads) { start(threads); }
  ~Pool() { stop(); }

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    stop();
    start(threads);
  }

  void run(int parts, const std::function<void(int)>& body) {
    std::unique_lock<std::mutex> lock(run_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || workers_.empty() || parts <= 1 || parts >= (1 << 20)) {
      for (int p = 0; p < parts; ++p) body(p);
      return;
    }
    body_ = &body;
    pending_.store(parts, std::memory_order_relaxed);
    ++job_;
    // One word names the job, its part count and the next part: a worker that wakes late can
    // only take a part of the job that is current when it takes it.
    ticket_.store((job_ << 40) | (static_cast<uint64_t>(parts) << 20), std::memory_order_release);
    wake();
    work();
    for (int spins = 1; pending_.load(std::memory_order_acquire) != 0; ++spins) relax(spins);
  }

 private:
  void start(int threads) {
    quit_.store(false);
    // The generation a worker starts from is read here, not in the worker: one that read it
    // after a stop() had already moved it on would wait for a wake-up that never comes.
    const unsigned long now = generation_.load(std::memory_order_acquire);
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, now] { loop(now); });
  }

  void stop() {
    quit_.store(true);
    wake();
    for (auto& worker : workers_) worker.join();
    workers_.clear();
  }

  // A new generation, and the sleeping workers woken (libstdc++ 12's atomic wait missed
  // wake-ups here, so sleeping is a plain condition variable).
  void wake() {
    bool sleeping;
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      generation_.fetch_add(1, std::memory_order_release);
      sleeping = sleepers_ > 0;
    }
    if (sleeping) wakeup_.notify_all();
  }

  void work() {
    uint64_t ticket = ticket_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t index = ticket & 0xfffff, parts = (ticket >> 20) & 0xfffff;
      if (index >= parts) return;
      if (!ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire))
        continue;
      (*body_)(static_cast<int>(index));
      pending_.fetch_sub(1, std::memory_order_acq_rel);
      ticket = ticket_.load(std::memory_order_acquire);
    }
  }

  void loop(unsigned long seen) {
    for (;;) {
      int spins = 0;
      unsigned long now;
      while ((now = generation_.load(std::memory_order_acquire)) == seen) {
        if (++spins < SPIN_ROUNDS) {
          relax(spins);
        } else {
          std::unique_lock<std::mutex> lock(sleep_mutex_);
          ++sleepers_;
          wakeup_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
          --sleepers_;
        }
      }
      seen = now;
      if (quit_.load()) return;
      work();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  const std::function<void(int)>* body_ = nullptr;
  uint64_t job_ = 0;
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int> pending_{0};
  std::atomic<unsigned long> generation_{0};
  std::atomic<bool> quit_{false};
  std::mutex sleep_mutex_;
  std::condition_variable wakeup_;
  int sleepers_ = 0;
};

Pool& pool() {
  static Pool instance(default_threads());
  return instance;
}

}  // namespace

void parallel_for(int parts, const std::function<void(int)>& body) { pool().run(parts, body); }
int thread_count() { return pool().threads(); }
int work_parts(std::size_t bytes, long most) {
  return bytes < MIN_PARALLEL_BYTES ? 1 : static_cast<int>(std::max(1L, most));
}
void set_thread_count(int threads) { pool().resize(threads > 0 ? threads : 1); }

}  // namespace exo_kernels
