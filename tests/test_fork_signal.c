/* test_fork_signal.c: fork from signal handlers that interrupt malloc, free and fork.
 *
 * The contract glibc keeps (for a single-threaded process, where its fork takes no malloc lock): processes
 * of the test's own send SIGUSR1 to it without pause while it mallocs and frees blocks of random sizes, up
 * to huge ones (which take threadheap's segment-cache lock), and forks now and then; the handler forks a
 * child that exits at once and waits for it. A handler that interrupted threadheap inside one of its locked
 * sections, or inside threadheap's own fork handler, forks while its own thread holds that lock: the fork
 * handler must not wait for it. Every fork's child must exit 0, and a hang is caught by alarm().
 *
 * With --threads (threadheap only: glibc's fork takes its arena locks when several threads run, and would
 * hang here): a second thread does the same malloc/free churn, and the signals go to it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static volatile sig_atomic_t handler_forks, handler_bad;

static void on_usr1(int sig) {
  (void)sig;
  int saved = errno;
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0, r;
  while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (pid < 0 || r != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) handler_bad = handler_bad + 1;
  handler_forks = handler_forks + 1;
  errno = saved;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_fork_signal: hung (fork from a signal handler): deadlock\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(2);
}

/* A child process that signals target until it is killed. */
static pid_t start_sender(pid_t target, int pause_us) {
  pid_t pid = fork();
  if (pid == 0) {
    for (;;) {
      if (kill(target, SIGUSR1) != 0) _exit(0);
      usleep((useconds_t)pause_us);
    }
  }
  return pid;
}

/* Random sizes up to 70,000 bytes, and one in 16 a huge block of up to 6 MiB. */
static size_t pick_size(unsigned *seed) {
  unsigned r = (unsigned)rand_r(seed);
  return (r & 15) == 0 ? ((size_t)1 << 20) + (size_t)rand_r(seed) % ((size_t)5 << 20) : (size_t)(r % 70000);
}

#define SLOTS 1009
static atomic_int churn_stop;

/* Mallocs and frees into slots, checking a byte at each end of every block; forks one time in seven when
 * do_fork. Returns the failures. */
static int churn(unsigned seed, int iterations, bool do_fork) {
  static __thread unsigned char *slot[SLOTS];
  static __thread size_t slot_size[SLOTS];
  int bad = 0;
  for (int i = 0; (iterations < 0 || i < iterations) && !atomic_load(&churn_stop); i++) {
    int k = rand_r(&seed) % SLOTS;
    if (do_fork && rand_r(&seed) % 7 == 0) {
      pid_t pid = fork();
      if (pid == 0) _exit(0);
      int status = 0, r;
      while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
      }
      bad += pid < 0 || r != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    if (slot[k] != NULL) {
      size_t n = slot_size[k];
      bad += slot[k][0] != (unsigned char)k || (n > 1 && slot[k][n - 1] != (unsigned char)(k >> 3));
      free(slot[k]);
    }
    size_t n = pick_size(&seed);
    slot[k] = malloc(n);
    slot_size[k] = n;
    if (slot[k] == NULL) {
      bad++;
      continue;
    }
    if (n > 0) slot[k][0] = (unsigned char)k;
    if (n > 1) slot[k][n - 1] = (unsigned char)(k >> 3);
  }
  for (int k = 0; k < SLOTS; k++) free(slot[k]), slot[k] = NULL;
  return bad;
}

static void *churn_thread(void *arg) {
  (void)arg;
  return (void *)(intptr_t)churn(7, -1, false);
}

int main(int argc, char **argv) {
  bool threads = argc > 1 && strcmp(argv[1], "--threads") == 0;
  int iterations = 4000;
  signal(SIGALRM, on_alarm);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  alarm(90);

  int bad;
  pid_t senders[3];
  if (!threads) {
    for (int i = 0; i < 3; i++) senders[i] = start_sender(getpid(), 3000);
    bad = churn(1, iterations, true);
  } else {
    /* The signals go to the process; blocking them in the main thread sends them to the worker. */
    pthread_t worker;
    pthread_create(&worker, NULL, churn_thread, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    for (int i = 0; i < 3; i++) senders[i] = start_sender(getpid(), 3000);
    while (handler_forks < 3000 && !handler_bad) usleep(1000);
    atomic_store(&churn_stop, 1);
    void *r;
    pthread_join(worker, &r);
    bad = (int)(intptr_t)r;
  }
  for (int i = 0; i < 3; i++) {
    kill(senders[i], SIGKILL);
    waitpid(senders[i], NULL, 0);
  }
  alarm(0);
  CHECK_MSG(bad == 0, "%d blocks or forks failed", bad);
  CHECK_MSG(handler_forks > 0, "no signal arrived");
  CHECK_MSG(handler_bad == 0, "%d of %d forks in the handler failed", (int)handler_bad, (int)handler_forks);
  printf("%d forks from a signal handler (%s)\n", (int)handler_forks, threads ? "two threads" : "one thread");
  return check_summary();
}
