/* os_linux.c: the OS layer (os_map_aligned and friends); the only file that makes system calls. */
#define _GNU_SOURCE
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static size_t page_size = 4096;

/* Every system call that maps, unmaps or advises memory is timed (two clock reads, tens of nanoseconds
 * beside a call of microseconds) and counted: the time a program spends in its allocator's OS calls is
 * one of the costs th_stats_get and the live export show. */
static inline uint64_t clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#define TIMED(call)                                   \
  ({                                                  \
    uint64_t t0_ = clock_ns();                        \
    __typeof__(call) r_ = (call);                     \
    stats_os_call(clock_ns() - t0_);                  \
    r_;                                               \
  })

void os_init(void) {
  long ps = sysconf(_SC_PAGESIZE);
  if (ps > 0) page_size = (size_t)ps;
}

size_t os_page_size(void) { return page_size; }

/* Asked for when an explicit heap is made, not at start: glibc reads it from /sys, and the code that does
 * (a file read, a number parsed) would stay mapped in every program that preloads threadheap. */
size_t os_cpu_count(void) {
  static _Atomic(size_t) cpu_count;
  size_t n = atomic_load_explicit(&cpu_count, memory_order_relaxed);
  if (n == 0) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    n = online > 0 ? (size_t)online : 1;
    atomic_store_explicit(&cpu_count, n, memory_order_relaxed);
  }
  return n;
}

static void *map_aligned(size_t size, size_t align, int prot) {
  /* Over-map and trim: the kernel gives page alignment only. The hint-free mapping keeps us in the
   * 47-bit user address space that the segment map covers. */
  size_t over = size + align;
  if (over < size) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = TIMED(mmap(NULL, over, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (p == MAP_FAILED) {
    options_verbose("the OS refused to map %zu bytes (errno %d)", over, errno);
    return NULL;
  }
  uintptr_t start = (uintptr_t)p;
  uintptr_t aligned = (start + align - 1) & ~(uintptr_t)(align - 1);
  if (aligned > start) TIMED(munmap(p, aligned - start));
  uintptr_t end = aligned + size;
  if (start + over > end) TIMED(munmap((void *)end, start + over - end));
  stats_os_map(size);
  return (void *)aligned;
}

void *os_map_aligned(size_t size, size_t align) { return map_aligned(size, align, PROT_READ | PROT_WRITE); }

void *os_reserve_aligned(size_t size, size_t align) { return map_aligned(size, align, PROT_NONE); }

bool os_overcommit_strict(void) {
  char mode[4] = {0};
  return os_read_file("/proc/sys/vm/overcommit_memory", mode, sizeof mode - 1) > 0 && mode[0] == '2';
}

void *os_reserve(size_t size) {
  void *p = TIMED(mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (p == MAP_FAILED) {
    options_verbose("the OS refused to reserve %zu bytes (errno %d)", size, errno);
    return NULL;
  }
  return p;
}

void *os_reserve_zero(size_t size) {
  void *p = TIMED(mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  return p == MAP_FAILED ? NULL : p;
}

bool os_make_writable(void *p, size_t size) {
  if (TIMED(mprotect(p, size, PROT_READ | PROT_WRITE)) == 0) return true;
  options_verbose("the OS refused to make %zu bytes writable (errno %d)", size, errno);
  return false;
}

void os_unreserve(void *p, size_t size) { TIMED(munmap(p, size)); }

size_t os_address_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  return (size_t)rl.rlim_cur;
}

void os_unmap(void *p, size_t size) {
  if (TIMED(munmap(p, size)) == 0) stats_os_unmap(size);
}

void os_purge(void *p, size_t size) {
  /* MADV_DONTNEED rather than MADV_FREE: RSS drops at once, which is what users and their monitors see. */
  if (TIMED(madvise(p, size, MADV_DONTNEED)) == 0) stats_os_purge(size);
}

void os_yield(void) { sched_yield(); }

bool os_fence_register(void) {
  return TIMED(syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0)) == 0;
}

bool os_fence_all_threads(void) {
  if (TIMED(syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0)) == 0) return true;
  /* Not registered (os_fence_register could not): register, then once more. */
  if (errno != EPERM || !os_fence_register()) return false;
  return TIMED(syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0)) == 0;
}

void os_protect(void *p, size_t size, bool access) {
  if (TIMED(mprotect(p, size, access ? PROT_READ | PROT_WRITE : PROT_NONE)) != 0)
    options_verbose("the OS refused to protect %zu bytes (errno %d)", size, errno); /* no guard: runs on */
}

void os_commit(void *p, size_t size) {
#ifdef MADV_POPULATE_WRITE
  if (TIMED(madvise(p, size, MADV_POPULATE_WRITE)) == 0) return;
#endif
  volatile uint8_t *b = p;
  for (size_t i = 0; i < size; i += page_size) b[i] = b[i];
}

void os_advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
  TIMED(madvise(p, size, MADV_HUGEPAGE));
#else
  (void)p, (void)size;
#endif
}

void *os_remap(void *p, size_t old_size, size_t new_size, void *dest) {
  void *q = dest == NULL ? TIMED(mremap(p, old_size, new_size, 0))
                         : TIMED(mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dest));
  return q == MAP_FAILED ? NULL : q;
}

static bool move_one(uint8_t *from, size_t size, uint8_t *to) {
  return TIMED(mremap(from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, to)) != MAP_FAILED;
}

bool os_move(void *from, size_t size, void *to, size_t granule) {
  uint8_t *f = from, *t = to;
  if (move_one(f, size, t)) return true;
  size_t done = 0;
  while (done < size && move_one(f + done, granule, t + done)) done += granule;
  if (done == size) return true;
  while (done > 0) {
    done -= granule;
    if (!move_one(t + done, granule, f + done))
      report_fatal("the OS refused to move a block's pages back after a failed move");
  }
  return false;
}

bool os_mutex_lock_timed(pthread_mutex_t *m, unsigned ms) {
  /* timedlock rather than clocklock: ThreadSanitizer (GCC 12) sees only the former take the lock. A jump of
   * the real-time clock only shortens or lengthens one wait. */
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_nsec += (long)ms * 1000000L;
  t.tv_sec += t.tv_nsec / 1000000000L;
  t.tv_nsec %= 1000000000L;
  return pthread_mutex_timedlock(m, &t) == 0;
}

uint64_t os_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool os_thread_usage(uint64_t *cpu_ms, uint64_t *blocked) {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return false;
  *cpu_ms = (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000u +
            (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000u;
  *blocked = (uint64_t)ru.ru_nvcsw;
  return true;
}

uint64_t os_random(void) {
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() ^ (uintptr_t)&r;
  }
  r |= 1; /* a zero key would make a zeroed word look like a freed block's tag */
  return r;
}

/* Before libc has set environ (in the program's .preinit_array, or the loader's allocations): the
 * environment the process started with, from /proc/self/environ, of which only the THREADHEAP_ entries are
 * kept. Read once, by the first call (options_init, under process_init's once). */
#define EARLY_PREFIX "THREADHEAP_"
static char early_env[4096];
static size_t early_env_len;
static int early_env_state; /* 0 not read, 1 read, -1 unreadable */

static void early_env_keep(const char *entry, size_t n) {
  if (n > sizeof EARLY_PREFIX - 1 && memcmp(entry, EARLY_PREFIX, sizeof EARLY_PREFIX - 1) == 0 &&
      early_env_len + n + 1 <= sizeof early_env) {
    memcpy(early_env + early_env_len, entry, n);
    early_env_len += n;
    early_env[early_env_len++] = '\0';
  }
}

static void early_env_read(void) {
  early_env_state = -1;
  int fd = open("/proc/self/environ", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[1024], entry[256];
  size_t n = 0; /* bytes of the current entry, counted past entry's size too */
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; i++) {
      if (buf[i] != '\0') {
        if (n < sizeof entry) entry[n] = buf[i];
        n++;
      } else {
        if (n <= sizeof entry) early_env_keep(entry, n);
        n = 0;
      }
    }
  }
  close(fd);
  early_env_state = 1;
}

bool os_environment_known(void) { return environ != NULL || early_env_state == 1; }

const char *os_getenv(const char *name) {
  if (getauxval(AT_SECURE)) return NULL;
  if (environ != NULL) return getenv(name);
  if (early_env_state == 0) early_env_read();
  size_t n = strlen(name);
  for (const char *e = early_env; e < early_env + early_env_len; e += strlen(e) + 1)
    if (strncmp(e, name, n) == 0 && e[n] == '=') return e + n + 1;
  return NULL;
}

static bool write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    s += w;
    n -= (size_t)w;
  }
  return true;
}

void os_write_err(const char *s, size_t n) { write_all(STDERR_FILENO, s, n); }

bool os_write_file(const char *path, const char *s, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, s, n);
  return close(fd) == 0 && ok;
}

static int kept_err = -1;
static dev_t kept_dev;
static ino_t kept_ino;

void os_keep_stderr(void) {
  struct stat st;
  int fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 100);
  if (fd < 0) return;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return;
  }
  kept_dev = st.st_dev;
  kept_ino = st.st_ino;
  kept_err = fd;
}

void os_write_err_late(const char *s, size_t n) {
  if (write_all(STDERR_FILENO, s, n) || errno != EBADF || kept_err < 0) return;
  /* The program may have closed the copy too, and the number may name another file now. */
  struct stat st;
  if (fstat(kept_err, &st) == 0 && st.st_dev == kept_dev && st.st_ino == kept_ino) write_all(kept_err, s, n);
}

long os_process_id(void) { return (long)getpid(); }

uint32_t os_thread_tid(void) { return (uint32_t)gettid(); }

void os_thread_name(uint32_t tid, char name[16]) {
  memset(name, 0, 16);
  char path[48];
  int n = 0;
  const char *pre = "/proc/self/task/";
  while (pre[n]) path[n] = pre[n], n++;
  char digits[12];
  int d = 0;
  do digits[d++] = (char)('0' + tid % 10), tid /= 10;
  while (tid);
  while (d) path[n++] = digits[--d];
  memcpy(path + n, "/comm", 6);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t r = read(fd, name, 15);
  close(fd);
  if (r <= 0) {
    memset(name, 0, 16);
    return;
  }
  if (name[r - 1] == '\n') name[r - 1] = '\0';
}

size_t os_read_self(void *dst, const void *src, size_t n) {
  struct iovec local = {dst, n}, remote = {(void *)src, n};
  ssize_t r = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  return r < 0 ? 0 : (size_t)r;
}

size_t os_resident(const void *p, size_t size, uint8_t *vec) {
  size_t ps = os_page_size(), pages = size / ps, resident = 0;
  uint8_t buf[1024];
  for (size_t done = 0; done < pages;) {
    size_t n = pages - done < sizeof buf ? pages - done : sizeof buf;
    uint8_t *v = vec ? vec + done : buf;
    if (mincore((uint8_t *)(uintptr_t)p + done * ps, n * ps, v) != 0) memset(v, 0, n); /* ENOMEM: unmapped */
    for (size_t i = 0; i < n; i++) resident += v[i] & 1;
    done += n;
  }
  return resident * ps;
}

uint64_t os_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void *os_export_open(const char *path, size_t size) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int fd = TIMED(open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd < 0) {
      /* A file of this pid can only be a dead process's (pids are reused): replace it. */
      if (errno == EEXIST && attempt == 0 && unlink(path) == 0) continue;
      return NULL;
    }
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0)
      p = TIMED(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    if (p == MAP_FAILED) {
      unlink(path);
      return NULL;
    }
    return p;
  }
  return NULL;
}

void os_export_remove(const char *path) { unlink(path); }

_Noreturn void os_abort(void) { abort(); }

/* ---- heap profiles */

void *os_reserve_rw(size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

typedef struct code_find_s {
  uintptr_t addr, lo, hi;
  bool found_in_program;
  char *build_id; /* os_build_id: where to write the id, or NULL */
  bool has_id;
} code_find_t;

static bool object_holds(const struct dl_phdr_info *info, uintptr_t addr, uintptr_t *lo, uintptr_t *hi) {
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (addr >= start && addr < start + ph->p_memsz) {
      *lo = start;
      *hi = start + ph->p_memsz;
      return true;
    }
  }
  return false;
}

static int code_find_one(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  code_find_t *f = arg;
  uintptr_t lo, hi;
  if (!object_holds(info, f->addr, &lo, &hi)) return 0;
  f->lo = lo;
  f->hi = hi;
  f->found_in_program = info->dlpi_name == NULL || info->dlpi_name[0] == '\0';
  if (f->build_id == NULL) return 1;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE) continue;
    const uint8_t *n = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr), *end = n + ph->p_memsz;
    while (n + sizeof(ElfW(Nhdr)) <= end) {
      const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)n;
      const uint8_t *name = n + sizeof *nh, *desc = name + ((nh->n_namesz + 3) & ~3u);
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(name, "GNU", 4) == 0 &&
          nh->n_descsz <= 40 && desc + nh->n_descsz <= end) {
        for (size_t k = 0; k < nh->n_descsz; k++) {
          f->build_id[2 * k] = "0123456789abcdef"[desc[k] >> 4];
          f->build_id[2 * k + 1] = "0123456789abcdef"[desc[k] & 15];
        }
        f->build_id[2 * nh->n_descsz] = '\0';
        f->has_id = true;
        return 1;
      }
      n = desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
  return 1;
}

void os_code_range(uintptr_t addr, uintptr_t *lo, uintptr_t *hi) {
  code_find_t f = {.addr = addr};
  *lo = *hi = 0;
  if (dl_iterate_phdr(code_find_one, &f) && !f.found_in_program) {
    *lo = f.lo;
    *hi = f.hi;
  }
}

bool os_build_id(uintptr_t addr, char out[81]) {
  code_find_t f = {.addr = addr, .build_id = out};
  dl_iterate_phdr(code_find_one, &f);
  return f.has_id;
}

int os_file_create(const char *path) { return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); }

bool os_file_write(int fd, const void *buf, size_t n) { return write_all(fd, buf, n); }

bool os_file_close(int fd) { return close(fd) == 0; }

size_t os_read_file(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t n = 0;
  while (n < cap) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(fd);
  return n;
}

void os_without_signals(void (*fn)(void)) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  fn();
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

bool os_on_sigusr2(void (*handler)(int)) {
  struct sigaction old;
  if (sigaction(SIGUSR2, NULL, &old) != 0) return false;
  if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL) return false; /* the program's own */
  if (old.sa_flags & SA_SIGINFO) return false;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGUSR2, &sa, NULL) == 0;
}

void os_sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
