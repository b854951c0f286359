// contention_heaps_new.cpp: the new/delete method of contention_heaps, in C++ so that it is a real
// new-expression (libstdc++'s operator new[] and delete[]).
#include <cstddef>

namespace {
// Each pointer is stored here so that no compiler may drop a new/delete pair; thread-local, so that the
// threads do not write one shared cache line.
thread_local void *volatile sink;
}  // namespace

extern "C" void contention_new_delete(std::size_t size, int n) {
  for (int i = 0; i < n; i++) {
    char *p = new char[size];
    sink = p;
    delete[] p;
  }
}
