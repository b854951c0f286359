// pairs_new.cpp: the pairs loop through C++'s operator new and sized delete (pairs --new), the calls a
// C++ program's `new T` and `delete p` compile to: what a C++ program pays per allocation.
#include <cstddef>
#include <new>

extern "C" void *volatile *pairs_sink(void);

extern "C" void pairs_new_loop(std::size_t size, long n) {
  void *volatile *sink = pairs_sink();
  for (long i = 0; i < n; i++) {
    void *p = ::operator new(size);
    *sink = p;
    ::operator delete(p, size);
  }
}
