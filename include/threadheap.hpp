// threadheap.hpp: the C++ layer of threadheap, header-only over the C API of threadheap.h (C++17).
//
//   th::thread_heap_allocated  base class: every operator new/delete of a derived class (plain, array,
//                              nothrow, sized, aligned) uses the calling thread's heap
//   th::allocator<T>           stateless STL allocator on the calling thread's heap
//   th::heap                   RAII owner of an explicit heap (th_heap_t), movable, not copyable
//   th::heap_allocator<T>      STL allocator bound to a th::heap
//   th::memory_resource        std::pmr::memory_resource over a th::heap
//
// Every allocation that can throw does what the global operator new does: on failure it calls the
// new_handler and tries again, and throws std::bad_alloc when there is none. Destroying a th::heap frees
// every block in it at once without running destructors, which is how a whole container graph built with
// heap_allocator or memory_resource is thrown away; the containers must not be used or destroyed after.
#ifndef THREADHEAP_HPP
#define THREADHEAP_HPP

#include <cerrno>
#include <cstddef>
#include <limits>
#include <memory_resource>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "threadheap.h"

namespace th {

// Every block of threadheap is aligned to 16 bytes (threadheap.h); stricter alignments take the aligned calls.
inline constexpr std::size_t min_align = 16;

namespace detail {

// The loop of the global operator new: retry after the new_handler, throw std::bad_alloc without one.
template <class Alloc>
void *alloc_or_throw(Alloc alloc) {
  for (;;) {
    if (void *p = alloc()) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

// The nothrow forms return nullptr where the throwing forms throw.
template <class Alloc>
void *alloc_or_null(Alloc alloc) noexcept {
  try {
    return alloc_or_throw(alloc);
  } catch (...) {
    return nullptr;
  }
}

// Bytes for n objects of size `size`; throws std::bad_array_new_length when the product overflows.
inline std::size_t array_bytes(std::size_t n, std::size_t size) {
  if (size != 0 && n > std::numeric_limits<std::size_t>::max() / size) throw std::bad_array_new_length();
  return n * size;
}

inline void *thread_alloc(std::size_t n, std::size_t align) {
  return align > min_align ? th_aligned_alloc(align, n) : th_malloc(n);
}

inline void *heap_alloc(th_heap_t *h, std::size_t n, std::size_t align) {
  return align > min_align ? th_heap_aligned_alloc(h, align, n) : th_heap_malloc(h, n);
}

}  // namespace detail

// Base class: objects of every derived class are allocated from the heap of the thread that news them, and
// may be deleted by any thread. The seeds' CThreadPrivateHeapAllocated, with no TLS set-up left to the user.
// It adds no data and no virtual function; deleting through a base pointer needs the derived hierarchy's
// own virtual destructor, as always.
class thread_heap_allocated {
 public:
  static void *operator new(std::size_t n) {
    return detail::alloc_or_throw([n] { return th_malloc(n); });
  }
  static void *operator new[](std::size_t n) {
    return detail::alloc_or_throw([n] { return th_malloc(n); });
  }
  static void *operator new(std::size_t n, std::align_val_t a) {
    return detail::alloc_or_throw([n, a] { return th_aligned_alloc(static_cast<std::size_t>(a), n); });
  }
  static void *operator new[](std::size_t n, std::align_val_t a) {
    return detail::alloc_or_throw([n, a] { return th_aligned_alloc(static_cast<std::size_t>(a), n); });
  }
  static void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
    return detail::alloc_or_null([n] { return th_malloc(n); });
  }
  static void *operator new[](std::size_t n, const std::nothrow_t &) noexcept {
    return detail::alloc_or_null([n] { return th_malloc(n); });
  }
  static void *operator new(std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
    return detail::alloc_or_null([n, a] { return th_aligned_alloc(static_cast<std::size_t>(a), n); });
  }
  static void *operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
    return detail::alloc_or_null([n, a] { return th_aligned_alloc(static_cast<std::size_t>(a), n); });
  }
  // A class operator new hides the global placement form; bring it back.
  static void *operator new(std::size_t, void *where) noexcept { return where; }
  static void *operator new[](std::size_t, void *where) noexcept { return where; }

  // th_free finds the block's heap and size itself, so every form is the same call.
  static void operator delete(void *p) noexcept { th_free(p); }
  static void operator delete[](void *p) noexcept { th_free(p); }
  static void operator delete(void *p, std::size_t) noexcept { th_free(p); }
  static void operator delete[](void *p, std::size_t) noexcept { th_free(p); }
  static void operator delete(void *p, std::align_val_t) noexcept { th_free(p); }
  static void operator delete[](void *p, std::align_val_t) noexcept { th_free(p); }
  static void operator delete(void *p, std::size_t, std::align_val_t) noexcept { th_free(p); }
  static void operator delete[](void *p, std::size_t, std::align_val_t) noexcept { th_free(p); }
  // Called when a constructor throws after a nothrow new.
  static void operator delete(void *p, const std::nothrow_t &) noexcept { th_free(p); }
  static void operator delete[](void *p, const std::nothrow_t &) noexcept { th_free(p); }
  static void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept { th_free(p); }
  static void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept { th_free(p); }
  static void operator delete(void *, void *) noexcept {}
  static void operator delete[](void *, void *) noexcept {}
};

// Stateless STL allocator on the calling thread's heap: any instance frees what any other allocated.
template <class T>
class allocator {
 public:
  using value_type = T;
  using is_always_equal = std::true_type;

  allocator() noexcept = default;
  template <class U>
  allocator(const allocator<U> &) noexcept {}

  T *allocate(std::size_t n) {
    std::size_t bytes = detail::array_bytes(n, sizeof(T));
    return static_cast<T *>(detail::alloc_or_throw([bytes] { return detail::thread_alloc(bytes, alignof(T)); }));
  }
  void deallocate(T *p, std::size_t) noexcept { th_free(p); }
};

template <class T, class U>
bool operator==(const allocator<T> &, const allocator<U> &) noexcept {
  return true;
}
template <class T, class U>
bool operator!=(const allocator<T> &, const allocator<U> &) noexcept {
  return false;
}

// RAII owner of an explicit heap. The destructor calls th_heap_destroy, which frees every block of the heap
// (without running destructors). A moved-from heap owns nothing; its get() is nullptr.
class heap {
 public:
  // th_heap_create's arguments: flags (0 or TH_HEAP_NO_SERIALIZE), bytes committed at creation, byte cap (0:
  // none). Throws std::invalid_argument for arguments th_heap_create rejects (EINVAL), else std::bad_alloc.
  explicit heap(unsigned flags = 0, std::size_t initial_size = 0, std::size_t max_size = 0)
      : h_(th_heap_create(flags, initial_size, max_size)) {
    if (h_ == nullptr) {
      if (errno == EINVAL) throw std::invalid_argument("th_heap_create: bad flags or sizes");
      throw std::bad_alloc();
    }
  }
  heap(const heap &) = delete;
  heap &operator=(const heap &) = delete;
  heap(heap &&other) noexcept : h_(std::exchange(other.h_, nullptr)) {}
  heap &operator=(heap &&other) noexcept {
    if (this != &other) {
      th_heap_destroy(h_);
      h_ = std::exchange(other.h_, nullptr);
    }
    return *this;
  }
  ~heap() { th_heap_destroy(h_); }

  th_heap_t *get() const noexcept { return h_; }

  // The C functions on this heap: nullptr (errno ENOMEM) on failure, as in C.
  void *malloc(std::size_t n) noexcept { return th_heap_malloc(h_, n); }
  void *calloc(std::size_t count, std::size_t n) noexcept { return th_heap_calloc(h_, count, n); }
  void *realloc(void *p, std::size_t n) noexcept { return th_heap_realloc(h_, p, n); }
  void *aligned_alloc(std::size_t align, std::size_t n) noexcept { return th_heap_aligned_alloc(h_, align, n); }
  static void free(void *p) noexcept { th_free(p); }

  // Constructs a T in this heap. Its storage goes with the heap; dispose() runs ~T and frees it earlier.
  template <class T, class... Args>
  T *make(Args &&...args) {
    th_heap_t *h = h_;
    void *p = detail::alloc_or_throw([h] { return detail::heap_alloc(h, sizeof(T), alignof(T)); });
    try {
      return ::new (p) T(std::forward<Args>(args)...);
    } catch (...) {
      th_free(p);
      throw;
    }
  }
  template <class T>
  static void dispose(T *p) noexcept {
    if (p == nullptr) return;
    p->~T();
    th_free(const_cast<void *>(static_cast<const volatile void *>(p)));
  }

 private:
  th_heap_t *h_;
};

// STL allocator bound to a th::heap. It holds the th_heap_t, so it stays valid when the th::heap object is
// moved; two heap_allocators are equal when they allocate from the same heap.
template <class T>
class heap_allocator {
 public:
  using value_type = T;

  explicit heap_allocator(const heap &h) noexcept : h_(h.get()) {}
  template <class U>
  heap_allocator(const heap_allocator<U> &other) noexcept : h_(other.get()) {}

  T *allocate(std::size_t n) {
    std::size_t bytes = detail::array_bytes(n, sizeof(T));
    th_heap_t *h = h_;
    return static_cast<T *>(detail::alloc_or_throw([h, bytes] { return detail::heap_alloc(h, bytes, alignof(T)); }));
  }
  void deallocate(T *p, std::size_t) noexcept { th_free(p); }

  th_heap_t *get() const noexcept { return h_; }

 private:
  th_heap_t *h_;
};

template <class T, class U>
bool operator==(const heap_allocator<T> &a, const heap_allocator<U> &b) noexcept {
  return a.get() == b.get();
}
template <class T, class U>
bool operator!=(const heap_allocator<T> &a, const heap_allocator<U> &b) noexcept {
  return a.get() != b.get();
}

// std::pmr::memory_resource over a th::heap, for the std::pmr containers. Resources over the same heap are
// equal: each frees what the other allocated.
class memory_resource : public std::pmr::memory_resource {
 public:
  explicit memory_resource(const heap &h) noexcept : h_(h.get()) {}
  th_heap_t *get() const noexcept { return h_; }

 private:
  void *do_allocate(std::size_t bytes, std::size_t align) override {
    th_heap_t *h = h_;
    return detail::alloc_or_throw([h, bytes, align] { return detail::heap_alloc(h, bytes, align); });
  }
  void do_deallocate(void *p, std::size_t, std::size_t) override { th_free(p); }
  bool do_is_equal(const std::pmr::memory_resource &other) const noexcept override {
    const auto *o = dynamic_cast<const memory_resource *>(&other);
    return o != nullptr && o->h_ == h_;
  }

  th_heap_t *h_;
};

}  // namespace th

#endif  // THREADHEAP_HPP
