#include "parallel.h"

#include "env.h"
#include "gather_qmm.h"
#include "switchboard/switchboard.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include "x86_intrin.h"
#define SB_CPU_RELAX() _mm_pause()
#else
#define SB_CPU_RELAX() ((void)0)
#endif

namespace switchboard::cpu {
namespace {

class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }

  int threads() const { return threads_; }
  void set_threads(int n) { threads_ = std::max(1, n); }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t chunks = (n + grain - 1) / grain;
    const int helpers = static_cast<int>(std::min<int64_t>(threads_, chunks)) - 1;
    if (helpers <= 0) {
      fn(0, n);
      return;
    }
    std::unique_lock<std::mutex> call(call_mu_);  // one parallel region at a time
    ensure_workers(helpers);
    next_.store(0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = {&fn, n, grain};
      pending_ = helpers;
      job_helpers_ = helpers;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_.fn = nullptr;
  }

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0, grain = 1;
  };

  // $SWITCHBOARD_THREADS, else one thread per hardware thread.
  Pool() {
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    threads_ = env_defaults().cpu_threads > 0 ? env_defaults().cpu_threads : std::max(1, hw);
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void ensure_workers(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      int id = static_cast<int>(workers_.size());
      workers_.emplace_back([this, id] { loop(id); });
    }
  }

  // Claims chunks until none are left.
  void work() {
    for (;;) {
      int64_t begin = next_.fetch_add(job_.grain);
      if (begin >= job_.n) return;
      (*job_.fn)(begin, std::min(job_.n, begin + job_.grain));
    }
  }

  void loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      // Decode runs a parallel region every few tens of microseconds; spinning a
      // little before sleeping avoids paying a thread wake-up for each one.
      for (int spin = 0; spin < 20000 && published_.load(std::memory_order_acquire) == seen; ++spin) SB_CPU_RELAX();
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && id < job_helpers_); });
        if (stop_) return;
        seen = generation_;
      }
      work();
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_, call_mu_;
  std::condition_variable cv_, done_cv_;
  Job job_;
  std::atomic<int64_t> next_{0};
  int pending_ = 0;
  int job_helpers_ = 0;  // workers with an index below this take part in the current job
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, readable without the lock
  bool stop_ = false;
};

}  // namespace

int num_threads() { return Pool::get().threads(); }
void set_num_threads(int n) { Pool::get().set_threads(n); }
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  Pool::get().run(n, std::max<int64_t>(1, grain), fn);
}

}  // namespace switchboard::cpu

namespace switchboard {
int cpu_threads() { return cpu::num_threads(); }
void set_cpu_threads(int n) { cpu::set_num_threads(n); }
const char* cpu_isa() { return cpu::cpu_path_name(cpu::active_cpu_path()); }
Status set_cpu_path_limit(std::string_view path) {
  const int p = parse_cpu_path(path);
  SB_CHECK_OR_RETURN(p >= 0, StatusCode::kInvalidArgument, "CPU path '%.*s': expected portable, avx2, avx512 or amx",
                     static_cast<int>(path.size()), path.data());
  cpu::set_cpu_path_limit(static_cast<cpu::CpuPath>(p));
  return Status::ok();
}
}  // namespace switchboard
