// test_heap_cpp.cpp: the C++ layer (threadheap.hpp) with the standard containers.
//
//  - th::thread_heap_allocated: every form of operator new/delete hands out threadheap blocks (th_usable_size
//    accepts them) with the alignment asked for; throwing new consults the new_handler, nothrow new returns
//    nullptr; objects made on one thread are deleted on another;
//  - th::allocator<T>: vector, list, map, unordered_map, and an over-aligned T;
//  - th::heap: make/dispose, move semantics, the C wrappers, bad arguments, the cap as std::bad_alloc;
//  - th::heap_allocator<T> and th::memory_resource: the containers and the pmr containers live in the heap,
//    allocators compare by heap, and a whole container graph is thrown away with the heap (its committed
//    bytes go back without a single destructor running);
//  - a serialized th::heap shared by four threads, each building its own containers in it.
#include <errno.h>
#include <stdint.h>

#include <cstring>

#include <list>
#include <map>
#include <memory_resource>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "check.h"
#include "threadheap.hpp"

namespace {

constexpr size_t KiB = size_t(1) << 10;
constexpr size_t MiB = size_t(1) << 20;

bool aligned_to(const void *p, size_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

size_t committed() {
  th_stats_t s;
  th_stats_get(&s);
  return s.committed;
}

// ---- th::thread_heap_allocated

struct Obj : th::thread_heap_allocated {
  explicit Obj(int v = 0) : value(v) { std::memset(buf, v & 0xff, sizeof buf); }
  int value;
  unsigned char buf[1020];
};

struct alignas(256) Wide : th::thread_heap_allocated {
  double d[4] = {1, 2, 3, 4};
};

// A non-trivial destructor: array new stores the element count before the array (a cookie), so the block
// starts below the array's address; delete[] must hand that block start back.
int g_destroyed;
struct Counted : th::thread_heap_allocated {
  ~Counted() { g_destroyed++; }
  std::string name = "an object whose string is long enough to allocate a block of its own";
};

struct Thrower : th::thread_heap_allocated {
  Thrower() { throw std::runtime_error("constructor"); }
  char pad[100];
};

int g_handler_calls;
void handler_once() {
  g_handler_calls++;
  std::set_new_handler(nullptr);  // the next failure throws
}
void handler_throws() {
  g_handler_calls++;
  throw std::bad_alloc();
}

void test_thread_heap_allocated() {
  Obj *o = new Obj(7);
  CHECK(th_usable_size(o) >= sizeof(Obj));
  CHECK(o->value == 7 && o->buf[1019] == 7);
  delete o;

  Obj *arr = new Obj[10];
  CHECK(th_usable_size(arr) >= 10 * sizeof(Obj));  // the block starts at the array (no cookie: trivial dtor)
  arr[9].value = 9;
  delete[] arr;

  g_destroyed = 0;
  Counted *cs = new Counted[7];
  cs[6].name += "!";
  delete[] cs;
  CHECK(g_destroyed == 7);

  Obj *n = new (std::nothrow) Obj(3);
  CHECK(n != nullptr && th_usable_size(n) >= sizeof(Obj));
  delete n;
  Obj *na = new (std::nothrow) Obj[3];
  CHECK(na != nullptr);
  delete[] na;

  // Over-aligned: the aligned forms.
  Wide *w = new Wide;
  CHECK(aligned_to(w, 256) && th_usable_size(w) >= sizeof(Wide) && w->d[3] == 4);
  delete w;
  Wide *wa = new Wide[5];
  CHECK(aligned_to(wa, 256));
  delete[] wa;
  Wide *wn = new (std::nothrow) Wide;
  CHECK(wn != nullptr && aligned_to(wn, 256));
  delete wn;

  // Every operator called by name, each block freed by a matching form.
  void *p = Obj::operator new(100);
  CHECK(th_usable_size(p) >= 100);
  Obj::operator delete(p, 100);
  p = Obj::operator new[](5000);
  CHECK(th_usable_size(p) >= 5000);
  Obj::operator delete[](p, 5000);
  p = Obj::operator new(100, std::align_val_t(4096));
  CHECK(aligned_to(p, 4096));
  Obj::operator delete(p, 100, std::align_val_t(4096));
  p = Obj::operator new[](300, std::align_val_t(1024));
  CHECK(aligned_to(p, 1024));
  Obj::operator delete[](p, std::align_val_t(1024));
  p = Obj::operator new(64, std::align_val_t(64), std::nothrow);
  CHECK(aligned_to(p, 64));
  Obj::operator delete(p, std::align_val_t(64), std::nothrow);
  p = Obj::operator new[](64, std::align_val_t(128), std::nothrow);
  CHECK(aligned_to(p, 128));
  Obj::operator delete[](p, std::align_val_t(128), std::nothrow);
  p = Obj::operator new(2 * MiB);  // huge
  CHECK(th_usable_size(p) >= 2 * MiB);
  Obj::operator delete(p);

  // Placement new still works on a derived class.
  alignas(Obj) unsigned char storage[sizeof(Obj)];
  Obj *placed = new (storage) Obj(5);
  CHECK(static_cast<void *>(placed) == storage && placed->value == 5);
  placed->~Obj();

  // Failure: the new_handler runs, then std::bad_alloc; nothrow gives nullptr.
  g_handler_calls = 0;
  std::set_new_handler(handler_once);
  bool threw = false;
  try {
    void *q = Obj::operator new(SIZE_MAX / 2);
    Obj::operator delete(q);
  } catch (const std::bad_alloc &) {
    threw = true;
  }
  CHECK(threw && g_handler_calls == 1);
  g_handler_calls = 0;
  std::set_new_handler(handler_throws);
  CHECK(Obj::operator new(SIZE_MAX / 2, std::nothrow) == nullptr);
  CHECK(Obj::operator new[](SIZE_MAX / 2, std::align_val_t(64), std::nothrow) == nullptr);
  CHECK(g_handler_calls == 2);
  std::set_new_handler(nullptr);
  CHECK(Obj::operator new(SIZE_MAX / 2, std::nothrow) == nullptr);

  // A throwing constructor: the block goes back through the class's delete, and the exception comes through.
  threw = false;
  try {
    Thrower *t = new Thrower;
    delete t;
  } catch (const std::runtime_error &) {
    threw = true;
  }
  CHECK(threw);

  // Made on other threads (each thread's own heap), deleted here.
  std::vector<Obj *> made(4);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; i++) ts.emplace_back([&made, i] { made[i] = new Obj(100 + i); });
  for (auto &t : ts) t.join();
  for (int i = 0; i < 4; i++) {
    CHECK(made[i]->value == 100 + i && made[i]->buf[500] == 100 + i);
    delete made[i];
  }
}

// ---- th::allocator<T>

struct alignas(64) Line {
  long v[8];
};

void test_allocator() {
  std::vector<int, th::allocator<int>> v;
  for (int i = 0; i < 100000; i++) v.push_back(i);
  CHECK(th_usable_size(v.data()) >= v.size() * sizeof(int));
  long sum = 0;
  for (int x : v) sum += x;
  CHECK(sum == 4999950000L);

  std::list<std::string, th::allocator<std::string>> l;
  for (int i = 0; i < 1000; i++) l.push_back(std::to_string(i));
  CHECK(l.size() == 1000 && l.back() == "999");

  std::map<int, double, std::less<int>, th::allocator<std::pair<const int, double>>> m;
  for (int i = 0; i < 5000; i++) m[i * 3] = i * 0.5;
  CHECK(m.size() == 5000 && m[2997] == 499.5);

  std::unordered_map<int, int, std::hash<int>, std::equal_to<int>, th::allocator<std::pair<const int, int>>> um;
  for (int i = 0; i < 20000; i++) um[i] = -i;
  bool ok = true;
  for (int i = 0; i < 20000; i++) ok = ok && um.at(i) == -i;
  CHECK(ok);

  std::vector<Line, th::allocator<Line>> lines(100);
  CHECK(aligned_to(lines.data(), 64));
  lines[99].v[7] = 42;
  CHECK(lines[99].v[7] == 42);

  th::allocator<int> a;
  th::allocator<double> b(a);
  CHECK(a == b && !(a != b));
  bool threw = false;
  try {
    (void)a.allocate(SIZE_MAX / 2);
  } catch (const std::bad_alloc &) {  // bad_array_new_length is a bad_alloc
    threw = true;
  }
  CHECK(threw);
}

// ---- th::heap

struct Node {
  Node(int v, Node *n) : value(v), next(n) {}
  int value;
  Node *next;
};

void test_heap_class() {
  th::heap h;
  CHECK(h.get() != nullptr);
  Node *list = nullptr;
  for (int i = 0; i < 1000; i++) list = h.make<Node>(i, list);
  int count = 0;
  for (Node *n = list; n; n = n->next) count++;
  CHECK(count == 1000 && list->value == 999);
  th::heap::dispose(list);  // one early; the rest go with the heap

  Wide *w = h.make<Wide>();
  CHECK(aligned_to(w, 256) && w->d[2] == 3);
  th::heap::dispose(w);

  void *p = h.malloc(100);
  void *c = h.calloc(10, 10);
  void *a = h.aligned_alloc(512, 100);
  CHECK(p && c && a && aligned_to(a, 512));
  p = h.realloc(p, 10000);
  CHECK(p != nullptr && th_usable_size(p) >= 10000);
  th::heap::free(p);
  th::heap::free(c);
  th::heap::free(a);

  // Moves: the th_heap_t goes along, the moved-from heap owns nothing.
  th_heap_t *raw = h.get();
  th::heap h2(std::move(h));
  CHECK(h2.get() == raw && h.get() == nullptr);
  th::heap h3(TH_HEAP_NO_SERIALIZE);
  h3 = std::move(h2);  // destroys h3's old heap
  CHECK(h3.get() == raw && h2.get() == nullptr);
  errno = 0;
  CHECK(h.malloc(16) == nullptr && errno == EINVAL);  // a moved-from heap allocates nothing

  // Bad arguments throw std::invalid_argument.
  bool threw = false;
  try {
    th::heap bad(0x2u);
  } catch (const std::invalid_argument &) {
    threw = true;
  }
  CHECK(threw);
  threw = false;
  try {
    th::heap bad(0, 2 * MiB, 1 * MiB);
  } catch (const std::invalid_argument &) {
    threw = true;
  }
  CHECK(threw);

  // A throwing constructor in make: the block goes back, the exception comes through.
  threw = false;
  try {
    h3.make<Thrower>();
  } catch (const std::runtime_error &) {
    threw = true;
  }
  CHECK(threw);

  // The cap turns into std::bad_alloc for the containers, and the heap stays usable.
  th::heap capped(0, 0, 1 * MiB);
  std::vector<char, th::heap_allocator<char>> big{th::heap_allocator<char>(capped)};
  threw = false;
  try {
    big.resize(2 * MiB);
  } catch (const std::bad_alloc &) {
    threw = true;
  }
  CHECK(threw && big.empty());
  big.resize(256 * KiB, 'x');
  CHECK(big.size() == 256 * KiB && big.back() == 'x');
}

// ---- th::heap_allocator<T> and th::memory_resource

template <class T>
using hvec = std::vector<T, th::heap_allocator<T>>;
using hstring = std::basic_string<char, std::char_traits<char>, th::heap_allocator<char>>;

void test_heap_allocator() {
  th::heap h;
  th::heap_allocator<int> ai(h);
  hvec<int> v(ai);
  for (int i = 0; i < 50000; i++) v.push_back(i * 2);
  CHECK(v[49999] == 99998);

  std::list<int, th::heap_allocator<int>> l(ai);  // rebinds to the list's node type, same heap
  for (int i = 0; i < 1000; i++) l.push_front(i);
  CHECK(l.front() == 999 && l.get_allocator() == ai);

  using MapAlloc = th::heap_allocator<std::pair<const int, hstring>>;
  std::map<int, hstring, std::less<int>, MapAlloc> m{MapAlloc(h)};
  for (int i = 0; i < 2000; i++)
    m.emplace(i, hstring("a value long enough to leave the small-string buffer " + std::to_string(i),
                         th::heap_allocator<char>(h)));
  // (hstring's substr would need a default-constructed allocator, which heap_allocator does not have.)
  const hstring &s1234 = m.at(1234);
  CHECK(s1234.compare(s1234.size() - 4, 4, "1234") == 0 && s1234.get_allocator() == ai);

  using UmAlloc = th::heap_allocator<std::pair<const std::string, int>>;
  std::unordered_map<std::string, int, std::hash<std::string>, std::equal_to<std::string>, UmAlloc> um{
      16, std::hash<std::string>(), std::equal_to<std::string>(), UmAlloc(h)};
  for (int i = 0; i < 3000; i++) um["k" + std::to_string(i)] = i;
  CHECK(um.at("k2999") == 2999 && um.size() == 3000);

  hvec<Line> lines(10, Line{}, th::heap_allocator<Line>(h));
  CHECK(aligned_to(lines.data(), 64));

  // Equality compares heaps; a rebound copy keeps the heap.
  th::heap other;
  th::heap_allocator<double> ad(ai);
  CHECK(ad == ai && ad.get() == h.get());
  CHECK(th::heap_allocator<int>(other) != ai);
  // Copy-assigning into a container of another heap copies the elements into that heap.
  hvec<int> w{th::heap_allocator<int>(other)};
  w = v;
  CHECK(w.size() == v.size() && w.get_allocator().get() == other.get() && w[123] == 246);
}

void test_memory_resource() {
  th::heap h;
  th::memory_resource res(h);
  th::memory_resource same(h);
  th::heap other_heap;
  th::memory_resource other(other_heap);
  CHECK(res == same && res.is_equal(same));
  CHECK(!(res == other));
  CHECK(!res.is_equal(*std::pmr::new_delete_resource()));

  void *p = res.allocate(100, 256);
  CHECK(aligned_to(p, 256) && th_usable_size(p) >= 100);
  res.deallocate(p, 100, 256);
  p = res.allocate(3 * MiB);
  CHECK(th_usable_size(p) >= 3 * MiB);
  same.deallocate(p, 3 * MiB);  // equal resources free each other's blocks

  std::pmr::vector<std::pmr::string> v(&res);
  for (int i = 0; i < 5000; i++) v.emplace_back("a pmr string that does not fit the small buffer " + std::to_string(i));
  CHECK(v[4321].get_allocator().resource() == &res);  // uses-allocator construction reached the strings
  CHECK(v[4321].substr(v[4321].size() - 4) == "4321");

  std::pmr::map<int, std::pmr::list<int>> m(&res);
  for (int i = 0; i < 500; i++)
    for (int k = 0; k < 10; k++) m[i].push_back(k);
  CHECK(m.size() == 500 && m[499].back() == 9 && m[0].get_allocator().resource() == &res);

  std::pmr::unordered_map<int, std::pmr::string> um(&res);
  for (int i = 0; i < 2000; i++) um[i] = std::to_string(i) + " as a string, long enough to allocate";
  CHECK(um.at(1999).rfind("1999", 0) == 0);
}

// A graph of containers built in a heap, never destroyed: destroying the heap takes all of it.
void test_throw_away_graph() {
  size_t base = committed();
  size_t grown;
  {
    th::heap h;
    th::memory_resource *res = h.make<th::memory_resource>(h);
    using Graph = std::pmr::unordered_map<int, std::pmr::vector<std::pmr::string>>;
    Graph *g = h.make<Graph>(res);
    for (int i = 0; i < 2000; i++) {
      auto &vec = (*g)[i];
      for (int k = 0; k < 20; k++) vec.emplace_back(64, static_cast<char>('a' + k));
    }
    using Tree = std::map<int, hvec<int>, std::less<int>, th::heap_allocator<std::pair<const int, hvec<int>>>>;
    Tree *t = h.make<Tree>(th::heap_allocator<std::pair<const int, hvec<int>>>(h));
    for (int i = 0; i < 2000; i++) t->emplace(i, hvec<int>(500, i, th::heap_allocator<int>(h)));
    CHECK(g->at(1999)[19][63] == 'a' + 19 && t->at(1999)[499] == 1999);
    grown = committed() - base;
    // No destructor runs: the heap goes, and with it every node, vector and string.
  }
  size_t after = committed();
  printf("container graph: %zu KiB committed in the heap, committed afterwards %+ld KiB from before\n", grown / KiB,
         (long)(after - base) / (long)KiB);
  CHECK_MSG(grown >= 6 * MiB, "the graph committed only %zu bytes", grown);
  CHECK_MSG(after <= base + 256 * KiB, "committed %zu after the heap went, %zu before", after, base);
}

// A serialized heap shared by four threads, each building and checking its own containers in it.
void test_shared_heap_threads() {
  th::heap h;
  std::vector<std::thread> ts;
  std::vector<long> sums(4);
  for (int t = 0; t < 4; t++)
    ts.emplace_back([&h, &sums, t] {
      th::memory_resource res(h);
      for (int round = 0; round < 20; round++) {
        hvec<long> v{th::heap_allocator<long>(h)};
        std::pmr::list<std::pmr::string> l(&res);
        for (long i = 0; i < 2000; i++) {
          v.push_back(i * (t + 1));
          if (i % 10 == 0) l.emplace_back(100, static_cast<char>('A' + t));
        }
        long s = 0;
        for (long x : v) s += x;
        bool ok = true;
        for (auto &str : l) ok = ok && str.size() == 100 && str[99] == 'A' + t;
        CHECK(ok);
        sums[t] = s;
      }
    });
  for (auto &t : ts) t.join();
  for (int t = 0; t < 4; t++) CHECK_MSG(sums[t] == 1999000L * (t + 1), "thread %d sum %ld", t, sums[t]);
}

}  // namespace

int main() {
  test_thread_heap_allocated();
  test_allocator();
  test_heap_class();
  test_heap_allocator();
  test_memory_resource();
  test_throw_away_graph();
  test_shared_heap_threads();
  return check_summary();
}
