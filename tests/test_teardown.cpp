// test_teardown.cpp: allocation while a thread is exiting. A C++ thread_local object's destructor and a
// pthread key destructor run after the thread's last ordinary code; they free blocks the thread allocated
// and allocate and free new ones, possibly after threadheap's own per-thread cleanup already ran. The key
// destructor re-arms itself twice, so it also runs in the later destructor rounds. Blocks the thread
// allocated (before and during teardown) and handed to main stay valid after it exited; main checks their
// contents and frees them. At the end every thread heap has been given back (threads_live as at start).
// The thread_local also owns std::strings, freed by operator delete as the thread exits.
// The th_* functions are called by name so that the test means the same with and without the overrides.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mutex>
#include <string>
#include <vector>

#include "check.h"
#include "threadheap.h"

namespace {

struct Handed {
  unsigned char *p;
  size_t size;
  unsigned key;
};

std::mutex g_lock;
std::vector<Handed> *g_handed;  // allocated by main before any thread starts
pthread_key_t g_key;

void fill(unsigned char *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i++) p[i] = static_cast<unsigned char>(key * 131u + i * 7u + (i >> 9));
}
bool intact(const unsigned char *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != static_cast<unsigned char>(key * 131u + i * 7u + (i >> 9))) return false;
  return true;
}

// Allocates a block, fills it and hands it to main.
void hand_to_main(size_t n, unsigned key) {
  unsigned char *p = static_cast<unsigned char *>(th_malloc(n));
  if (!CHECK(p != nullptr)) return;
  fill(p, n, key);
  std::lock_guard<std::mutex> g(g_lock);
  g_handed->push_back(Handed{p, n, key});
}

// Allocates, writes, checks and frees a block of each kind on the current (exiting) thread.
void churn_here(unsigned key) {
  static const size_t sizes[] = {24, 700, 9000, 150000, 3u << 20};
  for (size_t n : sizes) {
    unsigned char *p = static_cast<unsigned char *>(th_malloc(n));
    if (!CHECK_MSG(p != nullptr, "malloc(%zu) during teardown", n)) continue;
    fill(p, n, key);
    CHECK_MSG(intact(p, n, key), "block of %zu bytes allocated during teardown", n);
    th_free(p);
  }
}

// Besides its th_malloc block, the thread_local holds standard containers: their memory comes from operator
// new (threadheap's in the plain build) and is freed by the member destructors, after ~Local's body.
struct Local {
  unsigned char *block = nullptr;
  size_t size = 0;
  unsigned key = 0;
  std::vector<std::string> names;
  void init(size_t n, unsigned k) {
    block = static_cast<unsigned char *>(th_malloc(n));
    size = n;
    key = k;
    if (block) fill(block, n, k);
    for (unsigned i = 0; i < 40; i++) names.push_back(std::string(20 + (k + i) % 200, static_cast<char>('a' + i % 26)));
  }
  ~Local() {
    if (block != nullptr) {
      CHECK_MSG(intact(block, size, key), "thread_local block of %zu bytes at thread exit", size);
      th_free(block);
    }
    bool names_ok = names.size() == 40;
    for (unsigned i = 0; names_ok && i < 40; i++)
      names_ok = names[i] == std::string(20 + (key + i) % 200, static_cast<char>('a' + i % 26));
    CHECK_MSG(names_ok, "thread_local strings at thread exit (key %u)", key);
    churn_here(key + 1);
    hand_to_main(333, key + 2);
  }
};
thread_local Local t_local;

struct KeyState {
  unsigned char *block;
  size_t size;
  unsigned key;
  int rounds;
};

void key_destructor(void *arg) {
  KeyState *s = static_cast<KeyState *>(arg);
  if (s->block != nullptr) {
    CHECK_MSG(intact(s->block, s->size, s->key), "pthread-key block at thread exit (round %d)", s->rounds);
    th_free(s->block);
    s->block = nullptr;
  }
  churn_here(s->key + 10 + static_cast<unsigned>(s->rounds));
  hand_to_main(5000 + static_cast<size_t>(s->rounds), s->key + 20 + static_cast<unsigned>(s->rounds));
  if (++s->rounds < 3) {
    // Set again: glibc calls the destructor in a later round, after other keys' destructors ran.
    s->block = static_cast<unsigned char *>(th_malloc(s->size));
    if (s->block) fill(s->block, s->size, s->key);
    pthread_setspecific(g_key, s);
  } else {
    th_free(s);
  }
}

void *thread_main(void *arg) {
  unsigned id = static_cast<unsigned>(reinterpret_cast<uintptr_t>(arg));
  unsigned key = id * 100u;
  t_local.init(100 + id, key);
  KeyState *s = static_cast<KeyState *>(th_malloc(sizeof(KeyState)));
  if (!CHECK(s != nullptr)) return nullptr;
  s->size = 64 + id % 200;
  s->key = key + 50;
  s->rounds = 0;
  s->block = static_cast<unsigned char *>(th_malloc(s->size));
  if (s->block) fill(s->block, s->size, s->key);
  pthread_setspecific(g_key, s);
  // Ordinary blocks handed to main before the thread exits: small, medium and huge.
  hand_to_main(40, key + 60);
  hand_to_main(70000, key + 61);
  if (id % 8 == 0) hand_to_main((5u << 20) + id, key + 62);
  return nullptr;
}

}  // namespace

int main() {
  g_handed = new std::vector<Handed>();
  g_handed->reserve(4096);
  CHECK(pthread_key_create(&g_key, key_destructor) == 0);
  void *warm = th_malloc(16);
  th_free(warm);
  th_stats_t st0;
  th_stats_get(&st0);

  const int kThreads = 64, kWave = 8;
  size_t expected = 0;
  for (int base = 0; base < kThreads; base += kWave) {
    pthread_t t[kWave];
    int started = 0;
    for (int i = 0; i < kWave; i++) {
      uintptr_t id = static_cast<uintptr_t>(base + i + 1);
      if (!CHECK(pthread_create(&t[i], nullptr, thread_main, reinterpret_cast<void *>(id)) == 0)) break;
      started++;
      // Per thread: 2 or 3 ordinary blocks, 1 from the thread_local destructor, 3 from the key rounds.
      expected += 2 + (id % 8 == 0 ? 1 : 0) + 1 + 3;
    }
    for (int i = 0; i < started; i++) pthread_join(t[i], nullptr);
  }

  // Every thread has exited; its blocks are still intact and main can free them.
  size_t bad = 0;
  for (const Handed &h : *g_handed) {
    if (!intact(h.p, h.size, h.key)) bad++;
    th_free(h.p);
  }
  printf("%zu blocks handed to main by exited threads, %zu damaged\n", g_handed->size(), bad);
  CHECK_MSG(g_handed->size() == expected, "%zu blocks handed over, expected %zu (a destructor did not run)",
            g_handed->size(), expected);
  CHECK(bad == 0);

  th_stats_t st;
  th_stats_get(&st);
  printf("threads_live %zu (start %zu), heaps abandoned %zu\n", st.threads_live, st0.threads_live,
         st.heaps_abandoned);
  CHECK_MSG(st.threads_live == st0.threads_live, "threads_live %zu, started at %zu: a heap re-created during "
            "teardown was never given back", st.threads_live, st0.threads_live);
  delete g_handed;
  return check_summary();
}
