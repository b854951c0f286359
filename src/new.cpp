// new.cpp: the C++ operators new, served by threadheap in TH_OVERRIDE builds (operator new). new asks
// threadheap, and on failure calls the program's new_handler and tries again, or throws std::bad_alloc when
// there is none; the nothrow forms return nullptr instead of throwing. The two forms every `new T` calls,
// new(size_t) and new[](size_t), are defined in alloc.c, the malloc fast path under their C++ names, and come
// here when it fails (alloc_new_failed); every form of delete is th_free itself (free.c).
#include <cstddef>
#include <new>

#include "threadheap.h"

#define TH_EXPORT __attribute__((visibility("default")))

// The C++ runtime's two entry points that new needs, bound weakly by their symbol names, so that the
// library does not pull libstdc++ into every C program it is preloaded into. A program that calls operator
// new has libstdc++ loaded, and then both resolve; if they do not, out of memory stops the process.
extern "C" std::new_handler th_cxx_get_new_handler() noexcept __asm__("_ZSt15get_new_handlerv")
    __attribute__((weak));
extern "C" [[noreturn]] void th_cxx_throw_bad_alloc() __asm__("_ZSt17__throw_bad_allocv") __attribute__((weak));
extern "C" [[noreturn]] void th_new_out_of_memory(void);
// The exception support that the catch below uses, weak too (the personality routine is weakened by the
// build, see CMakeLists.txt): only a new_handler can throw there, and a program that installed one has the
// C++ runtime loaded.
extern "C" void *__cxa_begin_catch(void *) noexcept __attribute__((weak));
extern "C" void __cxa_end_catch() __attribute__((weak));

namespace {

std::new_handler current_new_handler() { return th_cxx_get_new_handler ? th_cxx_get_new_handler() : nullptr; }

// Out of memory: the loop the standard asks for. alignment 0 means the default alignment.
__attribute__((noinline, cold)) void *new_slow(std::size_t size, std::size_t alignment) {
  for (;;) {
    void *p = alignment ? th_aligned_alloc(alignment, size) : th_malloc(size);
    if (p != nullptr) return p;
    std::new_handler handler = current_new_handler();
    if (handler == nullptr) {
      if (th_cxx_throw_bad_alloc) th_cxx_throw_bad_alloc();
      th_new_out_of_memory();
    }
    handler();
  }
}

// The nothrow forms: new_slow inside a catch that turns the handler's std::bad_alloc into nullptr. A
// new_handler may throw only std::bad_alloc (or a class derived from it), so catch (...) is the same catch
// and needs no type information.
__attribute__((noinline, cold)) void *new_slow_nothrow(std::size_t size, std::size_t alignment) noexcept {
  try {
    return new_slow(size, alignment);
  } catch (...) {
    return nullptr;
  }
}

inline void *new_aligned(std::size_t size, std::align_val_t alignment) {
  void *p = th_aligned_alloc(static_cast<std::size_t>(alignment), size);
  return __builtin_expect(p != nullptr, 1) ? p : new_slow(size, static_cast<std::size_t>(alignment));
}

inline void *new_plain_nothrow(std::size_t size) noexcept {
  void *p = th_malloc(size);
  return __builtin_expect(p != nullptr, 1) ? p : new_slow_nothrow(size, 0);
}

inline void *new_aligned_nothrow(std::size_t size, std::align_val_t alignment) noexcept {
  void *p = th_aligned_alloc(static_cast<std::size_t>(alignment), size);
  return __builtin_expect(p != nullptr, 1) ? p : new_slow_nothrow(size, static_cast<std::size_t>(alignment));
}

}  // namespace

// alloc.c's operator new(size_t) and new[](size_t), once the malloc path returned NULL.
extern "C" void *alloc_new_failed(std::size_t size) { return new_slow(size, 0); }

TH_EXPORT void *operator new(std::size_t size, const std::nothrow_t &) noexcept { return new_plain_nothrow(size); }
TH_EXPORT void *operator new[](std::size_t size, const std::nothrow_t &) noexcept {
  return new_plain_nothrow(size);
}
TH_EXPORT void *operator new(std::size_t size, std::align_val_t alignment) { return new_aligned(size, alignment); }
TH_EXPORT void *operator new[](std::size_t size, std::align_val_t alignment) {
  return new_aligned(size, alignment);
}
TH_EXPORT void *operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t &) noexcept {
  return new_aligned_nothrow(size, alignment);
}
TH_EXPORT void *operator new[](std::size_t size, std::align_val_t alignment, const std::nothrow_t &) noexcept {
  return new_aligned_nothrow(size, alignment);
}
