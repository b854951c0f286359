/* test_slot_reuse.c: a new page starts in a free slot that is still committed, in whichever of the heap's
 * segments it is, before one whose memory was purged.
 *
 * One thread fills a small segment with pages of 4,096-byte blocks and starts a second one. It then frees
 * every block of the first segment but one page's, and th_collect purges the slots they leave (the first
 * segment, with free slots again, goes to the front of the heap's list). Then it frees the blocks of one page
 * of the second segment, and runs purge rounds for 0.6 of the purge delay (CTest sets 400 ms: rounds every
 * 100 ms): a round frees the emptied page, whose slot waits on the purge queue, still committed, for the
 * delay. The next new page (a block of 2,000 bytes, a class with no page yet) must start in that slot,
 * not in a purged slot of the front segment (which would fault its memory in while the committed one waited
 * to be purged): its block is in that slot, and every block still held keeps its contents. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "purge_rounds.h"
#include "threadheap.h"

enum { SIZE = 4096, BLOCKS = 16 * 72, SLOT = 65536 };
#define SEGMENT ((uintptr_t)4 << 20)

static unsigned char *a[BLOCKS];

static uintptr_t segment_of(const void *p) { return (uintptr_t)p & ~(SEGMENT - 1); }
static uintptr_t slot_of(const void *p) { return (uintptr_t)p & ~(uintptr_t)(SLOT - 1); }

int main(void) {
  const char *delay_env = getenv("THREADHEAP_PURGE_DELAY");
  double delay = delay_env ? atof(delay_env) / 1000 : 0;
  if (!CHECK(delay >= 0.2)) return check_summary(); /* CTest's 400 ms: the rounds below need room */
  void *small = th_malloc(16); /* run_rounds' class has its page from the start, in the first segment */
  for (int i = 0; i < BLOCKS; i++) {
    a[i] = th_malloc(SIZE);
    if (!CHECK(a[i] != NULL)) return check_summary();
    check_fill(a[i], SIZE, (unsigned)i);
  }
  uintptr_t first = segment_of(a[0]), second = 0;
  for (int i = 0; i < BLOCKS && second == 0; i++)
    if (segment_of(a[i]) != first) second = segment_of(a[i]);
  if (!CHECK_MSG(second != 0, "%d blocks of %d bytes did not reach a second segment", BLOCKS, SIZE))
    return check_summary();

  /* The first segment: every block freed but those of the slot of a[0] (its segment stays with the heap),
   * then its free slots purged. */
  uintptr_t kept = slot_of(a[0]);
  for (int i = 0; i < BLOCKS; i++) {
    if (a[i] && segment_of(a[i]) == first && slot_of(a[i]) != kept) {
      th_free(a[i]);
      a[i] = NULL;
    }
  }
  th_collect();

  /* The second segment: one page's blocks freed (a page of the class that is not its last), its slot
   * committed. */
  uintptr_t freed = 0;
  for (int i = BLOCKS - 1; i >= 0 && freed == 0; i--)
    if (a[i] && segment_of(a[i]) == second && slot_of(a[i]) != slot_of(a[BLOCKS - 1])) freed = slot_of(a[i]);
  if (!CHECK_MSG(freed != 0, "no page of the second segment to free")) return check_summary();
  for (int i = 0; i < BLOCKS; i++) {
    if (a[i] && slot_of(a[i]) == freed) {
      th_free(a[i]);
      a[i] = NULL;
    }
  }
  run_rounds(delay / 1.6); /* two rounds or more: the empty page's slot goes on the purge queue */
  long resident_before = resident_pages(freed, SLOT);
  CHECK_MSG(resident_before >= 15, "the freed page's slot holds %ld resident pages, not its 16", resident_before);

  unsigned char *b = th_malloc(2000);
  if (!CHECK(b != NULL)) return check_summary();
  memset(b, 0xb7, 2000);
  CHECK_MSG(slot_of(b) == freed,
            "the new page (block %p) did not start in the committed slot %p of the second segment (first "
            "segment %p)", (void *)b, (void *)freed, (void *)first);

  for (int i = 0; i < BLOCKS; i++) {
    if (a[i] == NULL) continue;
    CHECK_MSG(check_verify(a[i], SIZE, (unsigned)i) == SIZE, "block %d lost its contents", i);
    th_free(a[i]);
  }
  th_free(b);
  th_free(small);
  printf("new page in the committed slot: %s (its resident pages before: %ld)\n",
         slot_of(b) == freed ? "yes" : "no", resident_before);
  return check_summary();
}
