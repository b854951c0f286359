/* check.h: the test harness of threadheap's tests. CHECK records a failure with file:line and the
 * expression and keeps going, so one run reports every broken property rather than the first;
 * check_summary() prints the one closing line "N passed, N failed" and gives the exit code.
 *
 * The counters are updated with atomic builtins so that worker threads may CHECK too; the builtins work
 * in both C11 and C++17, so the C++ tests share this header. */
#ifndef TH_TESTS_CHECK_H
#define TH_TESTS_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* After this many failure lines the rest are only counted: a broken loop over a million sizes should not
 * bury the summary. */
#define CHECK_MAX_REPORTS 60

static long check_passed_count;
static long check_failed_count;

static inline int check_record(int ok, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static inline int check_record(int ok, const char *file, int line, const char *expr, const char *fmt, ...) {
  if (ok) {
    __atomic_fetch_add(&check_passed_count, 1, __ATOMIC_RELAXED);
    return 1;
  }
  long n = __atomic_fetch_add(&check_failed_count, 1, __ATOMIC_RELAXED);
  if (n < CHECK_MAX_REPORTS) {
    /* One fprintf per part is fine: stderr is unbuffered and the lines only need to be readable. */
    char extra[512] = "";
    if (fmt != NULL && fmt[0] != '\0') {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(extra, sizeof extra, fmt, ap);
      va_end(ap);
    }
    fprintf(stderr, "%s:%d: CHECK failed: %s%s%s\n", file, line, expr, extra[0] ? " -- " : "", extra);
  } else if (n == CHECK_MAX_REPORTS) {
    fprintf(stderr, "(further failures are counted but not printed)\n");
  }
  return 0;
}

/* CHECK(expr): passes when expr is true. Evaluates to 1 or 0 so a test can skip what depends on it. */
#define CHECK(...) check_record(!!(__VA_ARGS__), __FILE__, __LINE__, #__VA_ARGS__, "%s", "")
/* CHECK_MSG(expr, fmt, ...): the same, with the values that explain a failure. */
#define CHECK_MSG(cond, ...) check_record(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)

/* Line-buffer stdout before main: the report lines must reach the log even when the allocator stops the
 * process with abort(), which does not flush stdio buffers. */
__attribute__((constructor)) static void check_init(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

static inline long check_failures(void) { return __atomic_load_n(&check_failed_count, __ATOMIC_RELAXED); }

/* A field of /proc/self/statm in bytes: 0 the process's virtual size, 1 its resident size (VmRSS); 0 when
 * it cannot be read. */
static inline size_t check_statm_bytes(int field) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long v[2] = {0, 0};
  if (f) {
    if (fscanf(f, "%lu %lu", &v[0], &v[1]) != 2) v[0] = v[1] = 0;
    fclose(f);
  }
  return (size_t)v[field] * (size_t)sysconf(_SC_PAGESIZE);
}

static inline int check_summary(void) {
  long passed = __atomic_load_n(&check_passed_count, __ATOMIC_RELAXED);
  long failed = __atomic_load_n(&check_failed_count, __ATOMIC_RELAXED);
  fflush(stdout);
  printf("%ld passed, %ld failed\n", passed, failed);
  fflush(stdout);
  return failed == 0 ? 0 : 1;
}

/* A 64-bit finaliser: turns seeds and serial numbers into well-spread pattern keys for the tests. */
static inline uint64_t check_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdu;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53u;
  x ^= x >> 33;
  return x;
}

/* ---- block contents: bytes that depend on both the position and a key, so that a block holding another
 * block's bytes, or its own bytes shifted, does not pass for intact. */
static inline unsigned char check_pattern_byte(size_t i, unsigned key) {
  return (unsigned char)((i * 131u + (i >> 8) * 7u + key * 29u + 1u) & 0xff);
}
static inline void check_fill(void *p, size_t n, unsigned key) {
  unsigned char *b = (unsigned char *)p;
  for (size_t i = 0; i < n; i++) b[i] = check_pattern_byte(i, key);
}
/* Index of the first wrong byte, or n when all are right. */
static inline size_t check_verify(const void *p, size_t n, unsigned key) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != check_pattern_byte(i, key)) return i;
  return n;
}
static inline int check_all_zero(const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != 0) return 0;
  return 1;
}
static inline int check_aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* Read fd to its end into buf (cap bytes, NUL-terminated); *len is the length kept. */
static inline void check_read_all(int fd, char *buf, size_t cap, size_t *len) {
  *len = 0;
  for (;;) {
    char tmp[1024];
    ssize_t r = read(fd, tmp, sizeof tmp);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    size_t k = (size_t)r;
    if (*len + k > cap - 1) k = cap - 1 - *len;
    memcpy(buf + *len, tmp, k);
    *len += k;
  }
  buf[*len] = '\0';
}

/* ---- cases that must stop the process: each runs in a child */

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>

typedef struct check_child_s {
  int status;      /* from waitpid */
  char err[4096];  /* what the child wrote on stderr */
  size_t err_len;
  char info[512];  /* what the child wrote on its info pipe, when it had one */
} check_child_t;

/* fn(a, b) in a forked child with stderr captured, no core file, and a 20 s alarm (a hang fails the case
 * with SIGALRM instead of hanging the test). With info_fd non-NULL the child also gets, in *info_fd, the
 * write end of a pipe whose text lands in res->info: how the child tells the parent what to expect. */
static inline void check_run_child(void (*fn)(int, int), int a, int b, int *info_fd, check_child_t *res) {
  int err_pipe[2], info_pipe[2] = {-1, -1};
  memset(res, 0, sizeof *res);
  if (pipe(err_pipe) != 0 || (info_fd && pipe(info_pipe) != 0)) {
    perror("pipe");
    exit(2);
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  if (pid == 0) {
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core); /* the expected aborts should not write core files */
    alarm(20);
    close(err_pipe[0]);
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[1]);
    if (info_fd) {
      close(info_pipe[0]);
      *info_fd = info_pipe[1];
    }
    fn(a, b);
    _exit(0); /* the misuse was not caught */
  }
  close(err_pipe[1]);
  if (info_fd) {
    size_t info_len;
    close(info_pipe[1]);
    check_read_all(info_pipe[0], res->info, sizeof res->info, &info_len);
    close(info_pipe[0]);
  }
  check_read_all(err_pipe[0], res->err, sizeof res->err, &res->err_len);
  close(err_pipe[0]);
  while (waitpid(pid, &res->status, 0) < 0 && errno == EINTR) {
  }
}

/* The child's end of the info pipe, for tests that pass &check_info_fd to check_run_child. */
static int check_info_fd = -1;

/* In the child: what the parent should expect, formatted, on the info pipe (one write of a short message to
 * a pipe is atomic; the parent reads until EOF). */
static inline void check_expect(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void check_expect(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ssize_t w = write(check_info_fd, buf, strlen(buf) + 1);
  (void)w;
}

/* How a child ended, for a failure message. */
static inline const char *check_describe(int status, char *buf, size_t cap) {
  if (WIFSIGNALED(status))
    snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
  return buf;
}

#endif /* TH_TESTS_CHECK_H */
