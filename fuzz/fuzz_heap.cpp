// fuzz_heap.cpp: libFuzzer target for the explicit heap API. An input is a stream of operations on a table
// of 4 heap slots and 32 block slots:
//
//   byte  operation   arguments (bytes)
//   0     create      heap slot, flags, sizes        (an occupied slot is destroyed first)
//   1     destroy     heap slot                      (its blocks are dropped from the table, not freed)
//   2     malloc      heap, block slot, size (2)
//   3     calloc      heap, block slot, count, size
//   4     realloc     block slot, size (2)           th_realloc: the block stays in its heap
//   5     heap_realloc heap, block slot, size (2)    th_heap_realloc: the block moves to that heap
//   6     free        block slot
//   7     aligned     heap, block slot, alignment, size (2)
//   8     usable      block slot
//
// (operation byte modulo 9; a heap byte modulo 5 picks a heap slot, 4 meaning the thread's default heap; an
// empty heap slot stands for a NULL heap, which must fail with EINVAL). Every block is filled with a pattern
// of its own and checked in full before it is freed or reallocated, so blocks handed out twice or memory
// reused while live show up. Allocation may fail only in a capped heap (ENOMEM) or for bad arguments
// (EINVAL). Each input ends by destroying its heaps and freeing its default-heap blocks, so inputs do not
// depend on each other. CTest runs it in the default mode and in secure mode with zero-on-free
// (THREADHEAP_SECURE=2), where every block's canary is checked when it is freed or reallocated and every free
// block when it is handed out again.
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "threadheap.h"

namespace {

constexpr int kHeaps = 4;
constexpr int kBlocks = 32;
constexpr int kDefaultHeap = -1;
constexpr size_t KiB = 1024, MiB = 1024 * 1024;

struct Heap {
  th_heap_t *h;
  size_t cap;  // 0: none
};

struct Block {
  unsigned char *p;
  size_t size;
  uint32_t key;
  int heap;  // heap slot, or kDefaultHeap
};

Heap heaps[kHeaps];
Block blocks[kBlocks];
uint32_t next_key;

#define FUZZ_CHECK(cond)                                                               \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "fuzz_heap: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                         \
    }                                                                                  \
  } while (0)

struct Reader {
  const uint8_t *p;
  size_t left;
  uint8_t byte() {
    if (left == 0) return 0;
    left--;
    return *p++;
  }
  uint16_t u16() { return static_cast<uint16_t>(byte() | byte() << 8); }
};

unsigned char pattern(uint32_t key, size_t i) { return static_cast<unsigned char>(key * 97u + i * 7u + (i >> 8)); }

// Blocks up to 64 KiB hold the pattern in every byte. Larger ones in the first 64 bytes of every 4 KiB and in
// their last 64 bytes: every page is still written and checked, at a sixty-fourth of the cost.
constexpr size_t kFullPattern = 64 * KiB;
bool patterned(size_t i, size_t size) { return size <= kFullPattern || (i & 4095) < 64 || i + 64 >= size; }
size_t next_patterned(size_t i, size_t size) {
  if (size <= kFullPattern || (i & 4095) < 63 || i + 65 >= size) return i + 1;
  size_t next_page = (i | 4095) + 1;
  return next_page < size - 64 ? next_page : size - 64;
}

void fill(const Block &b) {
  for (size_t i = 0; i < b.size; i = next_patterned(i, b.size)) b.p[i] = pattern(b.key, i);
}

void check_contents(const Block &b, size_t n) {
  for (size_t i = 0; i < n && i < b.size; i = next_patterned(i, b.size))
    if (patterned(i, b.size) && b.p[i] != pattern(b.key, i)) {
      fprintf(stderr, "fuzz_heap: block %p (%zu bytes, heap %d) byte %zu is %#x, not %#x\n", (void *)b.p, b.size,
              b.heap, i, b.p[i], pattern(b.key, i));
      abort();
    }
}

// 0..255, 0..16K, 0..256K in steps of 16, 0..4M in steps of 256: every size range with few bytes.
size_t decode_size(uint16_t v) {
  size_t low = v & 0x3fff;
  switch (v >> 14) {
    case 0: return v & 0xff;
    case 1: return low;
    case 2: return low * 16;
    default: return low * 256;
  }
}

int pick_heap(uint8_t b) {
  int k = b % (kHeaps + 1);
  return k == kHeaps ? kDefaultHeap : k;
}

// A NULL result is allowed with EINVAL for a NULL heap, with ENOMEM for a capped heap.
void check_failure(int heap, bool null_heap) {
  if (null_heap) {
    FUZZ_CHECK(errno == EINVAL);
    return;
  }
  FUZZ_CHECK(heap != kDefaultHeap && heaps[heap].cap != 0);
  FUZZ_CHECK(errno == ENOMEM);
}

void take(int slot, void *p, size_t size, int heap) {
  Block &b = blocks[slot];
  b.p = static_cast<unsigned char *>(p);
  b.size = size;
  b.key = ++next_key;
  b.heap = heap;
  FUZZ_CHECK((reinterpret_cast<uintptr_t>(p) & 15) == 0);
  FUZZ_CHECK(th_usable_size(p) >= size);
  fill(b);
}

void free_block(int slot) {
  Block &b = blocks[slot];
  if (b.p == nullptr) return;
  check_contents(b, b.size);
  th_free(b.p);
  b.p = nullptr;
}

void destroy_heap(int k) {
  if (heaps[k].h == nullptr) return;
  for (Block &b : blocks)
    if (b.p != nullptr && b.heap == k) b.p = nullptr;  // gone with the heap
  th_heap_destroy(heaps[k].h);
  heaps[k].h = nullptr;
  // The other heaps' blocks are untouched by the destroy (their first bytes, to keep it cheap).
  for (Block &b : blocks)
    if (b.p != nullptr) check_contents(b, 256);
}

void op_create(Reader &r) {
  static const size_t initial[] = {0, 4 * KiB, 64 * KiB, 1 * MiB};
  static const size_t caps[] = {0, 0, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * KiB, 0};
  int k = r.byte() % kHeaps;
  uint8_t flags_byte = r.byte(), sizes = r.byte();
  unsigned flags = (flags_byte & 1) ? TH_HEAP_NO_SERIALIZE : 0;
  bool bad_flags = (flags_byte & 0xf0) == 0xf0;
  if (bad_flags) flags |= 0x2u << (flags_byte & 7);
  size_t init = initial[sizes & 3], cap = caps[(sizes >> 2) & 7];
  destroy_heap(k);
  errno = 0;
  th_heap_t *h = th_heap_create(flags, init, cap);
  if (bad_flags || (cap != 0 && init > cap)) {
    FUZZ_CHECK(h == nullptr && errno == EINVAL);
    return;
  }
  FUZZ_CHECK(h != nullptr);
  heaps[k] = Heap{h, cap};
}

void op_alloc(Reader &r, int kind) {
  int heap = pick_heap(r.byte());
  int slot = r.byte() % kBlocks;
  size_t count = 1, size, align = 0;
  if (kind == 3) {
    count = r.byte() % 64;
    size = r.byte();
  } else if (kind == 7) {
    align = size_t(1) << (r.byte() % 14);
    size = decode_size(r.u16());
  } else {
    size = decode_size(r.u16());
  }
  free_block(slot);
  th_heap_t *h = heap == kDefaultHeap ? nullptr : heaps[heap].h;
  bool null_heap = heap != kDefaultHeap && h == nullptr;
  errno = 0;
  void *p;
  if (kind == 2) p = heap == kDefaultHeap ? th_malloc(size) : th_heap_malloc(h, size);
  else if (kind == 3) p = heap == kDefaultHeap ? th_calloc(count, size) : th_heap_calloc(h, count, size);
  else p = heap == kDefaultHeap ? th_aligned_alloc(align, size) : th_heap_aligned_alloc(h, align, size);
  if (p == nullptr) {
    check_failure(heap, null_heap);
    return;
  }
  FUZZ_CHECK(!null_heap);
  if (kind == 3)
    for (size_t i = 0; i < count * size; i++) FUZZ_CHECK(static_cast<unsigned char *>(p)[i] == 0);
  if (kind == 7) FUZZ_CHECK((reinterpret_cast<uintptr_t>(p) & (align - 1)) == 0);
  take(slot, p, count * size, heap);
}

void op_realloc(Reader &r, bool with_heap) {
  int heap = with_heap ? pick_heap(r.byte()) : kDefaultHeap;
  int slot = r.byte() % kBlocks;
  size_t size = decode_size(r.u16());
  if (size == 0) size = 1;  // realloc to 0 frees; free has its own operation
  Block &b = blocks[slot];
  if (!with_heap && b.p == nullptr) return;
  if (b.p != nullptr) check_contents(b, b.size);
  th_heap_t *h = heap == kDefaultHeap ? nullptr : heaps[heap].h;
  bool null_heap = with_heap && heap != kDefaultHeap && h == nullptr;
  errno = 0;
  void *q;
  int target;
  if (!with_heap) {
    q = th_realloc(b.p, size);
    target = b.heap;
  } else {
    q = heap == kDefaultHeap ? th_realloc(b.p, size) : th_heap_realloc(h, b.p, size);
    // th_realloc on the default heap keeps a block in its own heap; th_heap_realloc moves it.
    target = heap == kDefaultHeap && b.p != nullptr ? b.heap : heap;
  }
  if (q == nullptr) {
    check_failure(target, null_heap);
    if (b.p != nullptr) check_contents(b, b.size);  // a failed realloc keeps the block
    return;
  }
  FUZZ_CHECK(!null_heap);
  size_t keep = b.p != nullptr ? (b.size < size ? b.size : size) : 0;
  Block old = b;
  old.p = static_cast<unsigned char *>(q);
  check_contents(old, keep);
  take(slot, q, size, target);
}

void run(const uint8_t *data, size_t size) {
  Reader r{data, size};
  int ops = 0;
  while (r.left > 0 && ops++ < 400) {
    switch (r.byte() % 9) {
      case 0: op_create(r); break;
      case 1: destroy_heap(r.byte() % kHeaps); break;
      case 2: op_alloc(r, 2); break;
      case 3: op_alloc(r, 3); break;
      case 4: op_realloc(r, false); break;
      case 5: op_realloc(r, true); break;
      case 6: free_block(r.byte() % kBlocks); break;
      case 7: op_alloc(r, 7); break;
      case 8: {
        Block &b = blocks[r.byte() % kBlocks];
        if (b.p != nullptr) {
          FUZZ_CHECK(th_usable_size(b.p) >= b.size);
          check_contents(b, b.size);
        }
        break;
      }
    }
  }
  for (int k = 0; k < kHeaps; k++) destroy_heap(k);
  for (int i = 0; i < kBlocks; i++) free_block(i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run(data, size);
  return 0;
}
