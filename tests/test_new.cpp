// test_new.cpp: threadheap's operator new and delete, every form: plain, array, nothrow, sized (C++14),
// aligned (C++17), aligned + nothrow, aligned + sized. Checks:
//  - each new form returns threadheap's block (th_usable_size accepts it), big enough and aligned as asked;
//  - each delete form really frees (a later th_free of the same pointer is reported as a double free, in a
//    child process);
//  - an impossible size calls the new_handler until it gives up, then throws std::bad_alloc; the nothrow
//    forms return nullptr (with no handler, with a handler that uninstalls itself, with one that throws);
//  - a wrong size given to sized delete corrupts nothing: blocks around it keep their contents, and the heap
//    goes on handing out distinct, intact blocks.
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <new>
#include <string>
#include <vector>

#include "check.h"
#include "threadheap.h"

namespace {

volatile size_t g_impossible = SIZE_MAX / 2;  // volatile: the compiler must not see the size

void fill(void *p, size_t n, unsigned key) {
  unsigned char *b = static_cast<unsigned char *>(p);
  for (size_t i = 0; i < n; i++) b[i] = static_cast<unsigned char>(key * 29u + i * 13u + (i >> 8));
}
bool intact(const void *p, size_t n, unsigned key) {
  const unsigned char *b = static_cast<const unsigned char *>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != static_cast<unsigned char>(key * 29u + i * 13u + (i >> 8))) return false;
  return true;
}

// One allocation form and the delete forms that match it.
enum NewForm { kPlain, kArray, kNothrow, kArrayNothrow, kAligned, kArrayAligned, kAlignedNothrow,
               kArrayAlignedNothrow, kNewForms };
const char *const kNewNames[] = {"new", "new[]", "new nothrow", "new[] nothrow", "new aligned",
                                 "new[] aligned", "new aligned nothrow", "new[] aligned nothrow"};

void *do_new(int form, size_t n, size_t align) {
  std::align_val_t a = static_cast<std::align_val_t>(align);
  switch (form) {
    case kPlain: return ::operator new(n);
    case kArray: return ::operator new[](n);
    case kNothrow: return ::operator new(n, std::nothrow);
    case kArrayNothrow: return ::operator new[](n, std::nothrow);
    case kAligned: return ::operator new(n, a);
    case kArrayAligned: return ::operator new[](n, a);
    case kAlignedNothrow: return ::operator new(n, a, std::nothrow);
    default: return ::operator new[](n, a, std::nothrow);
  }
}

// The 12 delete forms; size is what the form passes (right or wrong), align the alignment of the block.
enum DeleteForm { kDel, kDelArr, kDelNothrow, kDelArrNothrow, kDelSized, kDelArrSized, kDelAligned,
                  kDelArrAligned, kDelAlignedNothrow, kDelArrAlignedNothrow, kDelSizedAligned,
                  kDelArrSizedAligned, kDeleteForms };
const char *const kDeleteNames[] = {"delete", "delete[]", "delete nothrow", "delete[] nothrow", "delete sized",
                                    "delete[] sized", "delete aligned", "delete[] aligned",
                                    "delete aligned nothrow", "delete[] aligned nothrow",
                                    "delete sized aligned", "delete[] sized aligned"};
bool delete_is_aligned(int form) { return form >= kDelAligned; }

void do_delete(int form, void *p, size_t size, size_t align) {
  std::align_val_t a = static_cast<std::align_val_t>(align);
  switch (form) {
    case kDel: ::operator delete(p); break;
    case kDelArr: ::operator delete[](p); break;
    case kDelNothrow: ::operator delete(p, std::nothrow); break;
    case kDelArrNothrow: ::operator delete[](p, std::nothrow); break;
    case kDelSized: ::operator delete(p, size); break;
    case kDelArrSized: ::operator delete[](p, size); break;
    case kDelAligned: ::operator delete(p, a); break;
    case kDelArrAligned: ::operator delete[](p, a); break;
    case kDelAlignedNothrow: ::operator delete(p, a, std::nothrow); break;
    case kDelArrAlignedNothrow: ::operator delete[](p, a, std::nothrow); break;
    case kDelSizedAligned: ::operator delete(p, size, a); break;
    default: ::operator delete[](p, size, a); break;
  }
}

void test_new_forms() {
  static const size_t sizes[] = {0, 1, 24, 1000, 9000, 70000, 600000, 3u << 20};
  static const size_t aligns[] = {32, 64, 4096, 1u << 16};
  for (int form = 0; form < kNewForms; form++) {
    bool aligned = form >= kAligned;
    for (size_t n : sizes) {
      for (size_t ai = 0; ai < (aligned ? 4u : 1u); ai++) {
        size_t align = aligned ? aligns[ai] : 16;
        void *p = do_new(form, n, align);
        if (!CHECK_MSG(p != nullptr, "%s(%zu)", kNewNames[form], n)) continue;
        CHECK_MSG(reinterpret_cast<uintptr_t>(p) % align == 0, "%s(%zu, %zu): %p", kNewNames[form], n, align, p);
        CHECK_MSG(th_usable_size(p) >= n, "%s(%zu): usable %zu", kNewNames[form], n, th_usable_size(p));
        fill(p, n, static_cast<unsigned>(form));
        CHECK(intact(p, n, static_cast<unsigned>(form)));
        // Free with a delete form that matches (aligned blocks with aligned deletes, and so on).
        int del = static_cast<int>((n + ai) % 6) + (aligned ? 6 : 0);
        do_delete(del, p, n, align);
      }
    }
  }
  // Objects the compiler lays out: a class with alignas(64) goes to the aligned forms, and delete passes
  // its size (sized deallocation).
  struct alignas(64) Wide {
    unsigned char bytes[200];
  };
  std::vector<Wide *> wides;
  for (int i = 0; i < 100; i++) {
    Wide *w = new Wide;
    CHECK(reinterpret_cast<uintptr_t>(w) % 64 == 0);
    fill(w->bytes, sizeof w->bytes, static_cast<unsigned>(i));
    wides.push_back(w);
  }
  Wide *arr = new Wide[7];
  CHECK(reinterpret_cast<uintptr_t>(arr) % 64 == 0 && th_usable_size(arr) >= 7 * sizeof(Wide));
  delete[] arr;
  for (int i = 0; i < 100; i++) {
    CHECK(intact(wides[i]->bytes, sizeof wides[i]->bytes, static_cast<unsigned>(i)));
    delete wides[i];
  }
  // The standard library's containers allocate through the same operators.
  std::vector<std::string> v;
  for (int i = 0; i < 2000; i++) v.push_back(std::string(static_cast<size_t>(i % 300) + 20, static_cast<char>('a' + i % 26)));
  bool ok = true;
  for (int i = 0; i < 2000; i++) ok &= v[static_cast<size_t>(i)] == std::string(static_cast<size_t>(i % 300) + 20, static_cast<char>('a' + i % 26));
  CHECK(ok);
  CHECK(th_usable_size(v.data()) >= v.capacity() * sizeof(std::string));
}

// Each delete form frees: in a child, th_free of the deleted pointer must be reported as a double free.
void test_delete_frees() {
  for (int form = 0; form < kDeleteForms; form++) {
    int err[2];
    if (!CHECK(pipe(err) == 0)) return;
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      struct rlimit no_core = {0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      dup2(err[1], STDERR_FILENO);
      size_t align = delete_is_aligned(form) ? 128 : 16;
      void *p = delete_is_aligned(form) ? ::operator new(100, static_cast<std::align_val_t>(align))
                                        : ::operator new(100);
      void *keep = ::operator new(100);  // the page stays in use, so the freed block stays recognisable
      do_delete(form, p, 100, align);
      th_free(p);
      th_free(keep);
      _exit(0);
    }
    close(err[1]);
    char buf[512];
    size_t len = 0;
    ssize_t r;
    while (len < sizeof buf - 1 && (r = read(err[0], buf + len, sizeof buf - 1 - len)) > 0) len += static_cast<size_t>(r);
    buf[len] = '\0';
    close(err[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strncmp(buf, "threadheap: double free at ", 27) == 0,
              "%s did not free the block: status %#x, stderr \"%s\"", kDeleteNames[form], status, buf);
  }
}

int g_handler_calls;
int g_handler_limit;
void counting_handler() {
  if (++g_handler_calls >= g_handler_limit) std::set_new_handler(nullptr);
}
void throwing_handler() {
  g_handler_calls++;
  throw std::bad_alloc();
}

// An impossible request in one of the forms: whether it threw bad_alloc, and what it returned otherwise.
bool impossible_new_throws(int form, void **out) {
  *out = reinterpret_cast<void *>(1);
  try {
    *out = do_new(form, g_impossible, 64);
  } catch (const std::bad_alloc &) {
    return true;
  }
  return false;
}

void test_out_of_memory() {
  for (int form = 0; form < kNewForms; form++) {
    bool nothrow = form == kNothrow || form == kArrayNothrow || form == kAlignedNothrow || form == kArrayAlignedNothrow;
    void *p;
    // No handler: bad_alloc, or nullptr.
    std::set_new_handler(nullptr);
    bool threw = impossible_new_throws(form, &p);
    if (nothrow) CHECK_MSG(!threw && p == nullptr, "%s, no handler: %p", kNewNames[form], p);
    else CHECK_MSG(threw, "%s, no handler: no bad_alloc", kNewNames[form]);
    // A handler that gives up on its third call: called exactly three times, then the same outcome.
    g_handler_calls = 0;
    g_handler_limit = 3;
    std::set_new_handler(counting_handler);
    threw = impossible_new_throws(form, &p);
    CHECK_MSG(g_handler_calls == 3, "%s: handler called %d times", kNewNames[form], g_handler_calls);
    if (nothrow) CHECK(!threw && p == nullptr);
    else CHECK(threw);
    // A handler that throws: new passes the exception on; nothrow turns it into nullptr.
    g_handler_calls = 0;
    std::set_new_handler(throwing_handler);
    threw = impossible_new_throws(form, &p);
    CHECK(g_handler_calls == 1);
    if (nothrow) CHECK(!threw && p == nullptr);
    else CHECK(threw);
    std::set_new_handler(nullptr);
  }
  // A handler that makes room: it frees a reserve, and the allocation then succeeds (in a child with a low
  // RLIMIT_AS, so that running out of memory is real).
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    static std::vector<void *> *held;
    held = new std::vector<void *>();
    held->reserve(100000);
    struct rlimit rl;
    getrlimit(RLIMIT_AS, &rl);
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f == nullptr || fscanf(f, "%lu", &pages) != 1) _exit(3);
    fclose(f);
    rl.rlim_cur = pages * static_cast<unsigned long>(sysconf(_SC_PAGESIZE)) + (64ul << 20);
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(4);
    for (;;) {
      void *q = ::operator new(1u << 20, std::nothrow);
      if (q == nullptr) break;
      held->push_back(q);
    }
    if (held->size() < 8) _exit(5);
    static int calls;
    std::set_new_handler([] {
      calls++;
      for (int i = 0; i < 8 && !held->empty(); i++) {
        ::operator delete(held->back());
        held->pop_back();
      }
      th_collect();
    });
    void *q = nullptr;
    try {
      q = ::operator new(4u << 20);
    } catch (const std::bad_alloc &) {
      _exit(6);
    }
    fill(q, 4u << 20, 7);
    if (calls < 1 || !intact(q, 4u << 20, 7)) _exit(7);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "new_handler that frees memory: status %#x", status);
}

// A wrong size given to sized delete: the heap must not believe it.
void test_wrong_delete_size() {
  const int kCount = 3000;
  std::vector<void *> blocks(kCount);
  std::vector<size_t> sizes(kCount);
  for (int i = 0; i < kCount; i++) {
    sizes[i] = static_cast<size_t>(16 + (i * 37) % 2000);
    blocks[i] = ::operator new(sizes[i]);
    fill(blocks[i], sizes[i], static_cast<unsigned>(i));
  }
  // Every third block goes with a wrong size: too small, too large, or from another size range entirely.
  for (int i = 0; i < kCount; i += 3) {
    size_t wrong = i % 2 ? sizes[i] / 3 + 1 : sizes[i] * 40 + 100000;
    if (i % 9 == 0) ::operator delete[](blocks[i], wrong);
    else ::operator delete(blocks[i], wrong);
    blocks[i] = nullptr;
  }
  void *al = ::operator new(300, static_cast<std::align_val_t>(256));
  fill(al, 300, 999);
  ::operator delete(al, 5, static_cast<std::align_val_t>(256));
  // The neighbours are intact, and new blocks (which reuse the freed ones) are distinct and hold their data.
  bool ok = true;
  for (int i = 0; i < kCount; i++)
    if (blocks[i]) ok &= intact(blocks[i], sizes[i], static_cast<unsigned>(i));
  CHECK_MSG(ok, "a block next to one deleted with a wrong size was damaged");
  std::vector<void *> fresh;
  for (int i = 0; i < kCount; i++) {
    size_t n = static_cast<size_t>(16 + (i * 53) % 2000);
    void *p = ::operator new(n);
    fill(p, n, static_cast<unsigned>(i + 100000));
    fresh.push_back(p);
  }
  ok = true;
  for (int i = 0; i < kCount; i++) {
    size_t n = static_cast<size_t>(16 + (i * 53) % 2000);
    ok &= intact(fresh[static_cast<size_t>(i)], n, static_cast<unsigned>(i + 100000));
  }
  for (int i = 0; i < kCount; i++)
    if (blocks[i]) ok &= intact(blocks[i], sizes[i], static_cast<unsigned>(i));
  CHECK_MSG(ok, "blocks allocated after wrong-size deletes overlap");
  for (void *p : fresh) ::operator delete(p);
  for (int i = 0; i < kCount; i++)
    if (blocks[i]) ::operator delete(blocks[i], sizes[i]);
}

}  // namespace

int main() {
  test_new_forms();
  test_delete_frees();
  test_out_of_memory();
  test_wrong_delete_size();
  return check_summary();
}
