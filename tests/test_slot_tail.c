/* test_slot_tail.c: a page started in a free slot that is still committed gives back, on the purge rounds
 * after it stops growing, what the slot's last page had touched past its own carve.
 *
 * One thread fills three pages of 1,008-byte blocks, writes every block and frees them all; a purge round
 * frees the empty pages but the first of the class to their segment, where their slots wait, committed, for
 * the purge delay (CTest sets 200 ms: rounds every 50 ms). A block of 2,000 bytes then starts a page in one
 * of those slots (free slots still committed come first), which carves 4 KiB: the slot's other 60 KiB are
 * still resident from the first class (mincore), and must not be two rounds after, while the page holds its
 * one block and its contents. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "purge_rounds.h"
#include "threadheap.h"

enum { BLOCKS = 3 * 64, SLOT = 65536 };

int main(void) {
  static unsigned char *a[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    a[i] = th_malloc(1008);
    if (a[i]) memset(a[i], 0x5a, 1008);
  }
  for (int i = 0; i < BLOCKS; i++) th_free(a[i]);
  run_rounds(0.12); /* a round frees the empty second page: its slot stays committed for the delay */

  unsigned char *b = th_malloc(2000);
  if (!CHECK(b != NULL)) return check_summary();
  memset(b, 0xb7, 2000);
  uintptr_t slot = (uintptr_t)b & ~(uintptr_t)(SLOT - 1);
  int in_slot = 0;
  for (int i = 0; i < BLOCKS; i++) in_slot |= ((uintptr_t)a[i] & ~(uintptr_t)(SLOT - 1)) == slot;
  CHECK_MSG(in_slot, "the page of 2,000-byte blocks (block %p) did not start in a slot of the freed pages",
            (void *)b);
  long before = resident_pages(slot, SLOT);
  run_rounds(0.25); /* at least two rounds: the page has stopped growing */
  long after = resident_pages(slot, SLOT);
  if (in_slot) {
    CHECK_MSG(before >= 8, "only %ld of the slot's 16 OS pages resident when the page started in it", before);
    /* The carve, one or two OS pages; in a segment's first slot also the segment's header, up to 3. */
    long most = slot % (4u << 20) == 0 ? 5 : 2;
    CHECK_MSG(after >= 1 && after <= most,
              "%ld of the slot's OS pages resident two rounds later (its carve is 4 KiB; at most %ld)", after, most);
  }
  int bad = 0;
  for (int i = 0; i < 2000; i++) bad += b[i] != 0xb7;
  CHECK_MSG(bad == 0, "%d bytes of the live block changed", bad);
  th_free(b);
  printf("slot %#lx: %ld OS pages resident when the page started in it, %ld after the rounds\n",
         (unsigned long)slot, before, after);
  return check_summary();
}
