#include "mapped_file.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace switchboard {
namespace {

// Guarded ranges, read by the signal handler without locks: a slot is live while begin != 0.
struct GuardSlot {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<bool> faulted{false};
  std::atomic<bool> taken{false};
};
constexpr int kSlots = 256;
GuardSlot g_slots[kSlots];
struct sigaction g_previous {};
uintptr_t g_page = 4096;

void forward(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    // Default disposition: returning re-executes the faulting read, which now kills the process.
    ::signal(SIGBUS, SIG_DFL);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardSlot& s : g_slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire), e = s.end.load(std::memory_order_acquire);
    if (b == 0 || addr < b || addr >= e) continue;
    // Past the file's new end every page faults: replace the rest of the mapping at once.
    const uintptr_t from = addr & ~(g_page - 1), to = (e + g_page - 1) & ~(g_page - 1);
    const int saved = errno;  // mmap is a plain system call; errno is the only state it touches
    void* r = ::mmap(reinterpret_cast<void*>(from), to - from, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    errno = saved;
    if (r == MAP_FAILED) break;
    s.faulted.store(true, std::memory_order_release);
    return;
  }
  forward(sig, info, context);
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

int take_slot(uintptr_t begin, uintptr_t end) {
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (!g_slots[i].taken.compare_exchange_strong(expected, true)) continue;
    g_slots[i].faulted.store(false);
    g_slots[i].end.store(end, std::memory_order_release);
    g_slots[i].begin.store(begin, std::memory_order_release);
    return i;
  }
  return -1;
}

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::map(int fd, size_t size, const std::string& path) {
  std::unique_ptr<MappedFile> m(new MappedFile());
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED)
    return make_error(StatusCode::kIoError, "%s: cannot mmap: %s", path.c_str(), std::strerror(errno));
  m->base_ = p;
  m->size_ = size;
  install_handler();
  const auto b = reinterpret_cast<uintptr_t>(p);
  m->slot_ = take_slot(b, b + size);
  return m;
}

size_t MappedFile::release_pages(const void* p, size_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(p), e = b + bytes;
  for (GuardSlot& s : g_slots) {
    const uintptr_t sb = s.begin.load(std::memory_order_acquire), se = s.end.load(std::memory_order_acquire);
    if (sb == 0 || b < sb || e > se || e < b) continue;
    const uintptr_t from = (b + g_page - 1) & ~(g_page - 1), to = e & ~(g_page - 1);
    if (to <= from) return 0;
    // A private read-only file mapping: the pages are the file's, so dropping them loses nothing.
    return ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED) == 0 ? to - from : 0;
  }
  return 0;
}

bool MappedFile::faulted() const {
  return slot_ >= 0 && g_slots[slot_].faulted.load(std::memory_order_acquire);
}

MappedFile::~MappedFile() {
  if (slot_ >= 0) {  // unguard before unmapping: a fault at that address is no longer ours
    g_slots[slot_].begin.store(0, std::memory_order_release);
    g_slots[slot_].end.store(0, std::memory_order_release);
    g_slots[slot_].taken.store(false, std::memory_order_release);
  }
  if (base_ != nullptr) ::munmap(base_, size_);
}

}  // namespace switchboard
