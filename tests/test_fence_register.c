/* test_fence_register.c: the process is registered for membarrier's private expedited command before it has
 * a second thread.
 *
 * A sweep (sweep.c) fences every thread with that command, which needs the process registered. Registering
 * is immediate while the process has one thread; with more, the kernel first waits for an RCU grace period
 * (milliseconds). When the first sweep registered, it waited holding another thread's heap, and that
 * thread, entering a slow path, waited for it (mimalloc-bench's rptest lost 5-10 ms of a 10 ms phase to
 * it). The command fails with EPERM in an unregistered process, so calling it here, before any thread is
 * started and without registering, tells whether threadheap did. Exit 77 (skipped) where the kernel lacks
 * the command. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

static int fence(void) { return (int)syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0); }

int main(void) {
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
    printf("membarrier's private expedited command is not available: skipped\n");
    return 77;
  }
  void *p = th_malloc(64); /* the library is initialised by now (its constructor), and certainly after this */
  CHECK(p != NULL);
  int r = fence();
  CHECK_MSG(r == 0, "the process is not registered (membarrier: %d, errno %d)", r, errno);

  th_free(p);
  return check_summary();
}
