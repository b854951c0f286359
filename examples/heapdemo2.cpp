// heapdemo2: the thread-private heaps article's HeapDemo2 (seed 002), on Linux with threadheap. Threads
// that do nothing but create and delete an object of 1 KiB, timed twice:
//
//   shared heap   the object's class allocates from one heap that every thread shares (the Win32 process
//                 heap of the article: a serialized th::heap, so each allocation takes its lock);
//   private heap  the object's class derives from th::thread_heap_allocated, so each thread allocates from
//                 its own heap, with no lock and no set-up (the article needed a TLS slot and a HeapCreate
//                 per thread for this).
//
// As in the article, the threads are objects: a small Thread base class runs the virtual run() of the
// derived class on its own std::thread.
//
//   heapdemo2 [threads] [objects per thread]      defaults: 4 threads, 200000 objects
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "threadheap.hpp"

namespace {

// The heap every thread shares in the first run.
th::heap *shared_heap;

// Allocated from the shared heap: the article's object on the process heap.
struct SharedHeapObject {
  static void *operator new(std::size_t n) {
    void *p = shared_heap->malloc(n);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  static void operator delete(void *p) noexcept { th::heap::free(p); }
  char buffer[1024];
};

// Allocated from the calling thread's heap.
struct PrivateHeapObject : th::thread_heap_allocated {
  char buffer[1024];
};

// The article's CThread: derived classes provide run().
class Thread {
 public:
  virtual ~Thread() = default;
  void start() { thread_ = std::thread([this] { run(); }); }
  void join() { thread_.join(); }

 protected:
  virtual void run() = 0;

 private:
  std::thread thread_;
};

template <class Object>
class AllocatingThread : public Thread {
 public:
  explicit AllocatingThread(long count) : count_(count) {}

 protected:
  void run() override {
    for (long i = 0; i < count_; i++) {
      Object *o = new Object;
      o->buffer[0] = static_cast<char>(i);  // touch it, as a real object would be
      delete o;
    }
  }

 private:
  long count_;
};

// Runs `threads` threads of the given kind to completion; returns the elapsed seconds.
template <class Object>
double timed_run(int threads, long count) {
  std::vector<std::unique_ptr<Thread>> pool;
  for (int i = 0; i < threads; i++) pool.push_back(std::make_unique<AllocatingThread<Object>>(count));
  auto t0 = std::chrono::steady_clock::now();
  for (auto &t : pool) t->start();
  for (auto &t : pool) t->join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  long count = argc > 2 ? std::atol(argv[2]) : 200000;
  if (threads < 1 || count < 1) {
    std::fprintf(stderr, "usage: heapdemo2 [threads] [objects per thread]\n");
    return 2;
  }
  th::heap heap;  // serialized: any thread may allocate from it
  shared_heap = &heap;

  double shared = timed_run<SharedHeapObject>(threads, count);
  double priv = timed_run<PrivateHeapObject>(threads, count);
  double pairs = static_cast<double>(threads) * static_cast<double>(count);
  std::printf("heapdemo2: %d threads x %ld objects of %zu bytes\n", threads, count, sizeof(PrivateHeapObject));
  std::printf("heapdemo2: shared heap   %8.1f ms  (%.3f us per new/delete)\n", shared * 1e3, shared * 1e6 / pairs);
  std::printf("heapdemo2: private heaps %8.1f ms  (%.3f us per new/delete)  %.1fx\n", priv * 1e3,
              priv * 1e6 / pairs, shared / priv);
  return 0;
}
