/* os.h: the OS contract. Only os_linux.c makes system calls or reads the environment. */
#ifndef TH_OS_H
#define TH_OS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Read the page size and other facts once; safe before libc has finished starting. */
void os_init(void);
size_t os_page_size(void);
/* Online CPUs, read once by os_init (at least 1). */
size_t os_cpu_count(void);

/* Map size bytes of zeroed read-write memory aligned to align (a power of two >= the page size);
 * NULL on failure with errno set. size and align are multiples of the page size. */
void *os_map_aligned(size_t size, size_t align);
/* The same, but reserved with no access: each range is made read-write (os_make_writable) before it is
 * written. Strict overcommit charges only those ranges (segment_map_new's lazy commit). */
void *os_reserve_aligned(size_t size, size_t align);
/* The kernel charges every writable private mapping against its commit limit (vm.overcommit_memory = 2): a
 * file read, for options_init when THREADHEAP_LAZY_COMMIT is not set. */
bool os_overcommit_strict(void);
/* Reserve address space only (no access); NULL on failure. */
void *os_reserve(size_t size);
/* Reserve address space that reads as zero and takes no memory until written, which needs os_make_writable
 * first (a read-only mapping is not charged against strict overcommit's limit; writable ranges are);
 * NULL on failure with errno set. */
void *os_reserve_zero(size_t size);
bool os_make_writable(void *p, size_t size);
/* Give back what os_reserve_zero reserved (counted in no statistic, as the reserve was not). */
void os_unreserve(void *p, size_t size);
/* The address-space limit (RLIMIT_AS) in bytes, or SIZE_MAX when there is none. */
size_t os_address_limit(void);
void os_unmap(void *p, size_t size);
/* Give the memory back to the OS; it reads as zero when next touched. p and size are page multiples. */
void os_purge(void *p, size_t size);
/* A guard (access false: any access faults) or plain read-write memory again. p and size are page
 * multiples. */
void os_protect(void *p, size_t size, bool access);
/* Touch the range so that later writes take no page fault. */
void os_commit(void *p, size_t size);
/* Ask for transparent huge pages on the range (THREADHEAP_HUGE_PAGES). */
void os_advise_huge(void *p, size_t size);
/* Grow or shrink a mapping at p. With dest NULL only in place; otherwise it moves onto dest (which the
 * caller reserved). Returns the new address or NULL. */
void *os_remap(void *p, size_t old_size, size_t new_size, void *dest);
/* Move the pages of [from, from + size) over [to, to + size) of another mapping: page tables move, no byte is
 * copied, and the range at from is gone. One mremap moves one kernel mapping: a range of several (a segment
 * gathered from pieces) moves granule by granule, each within one mapping, and back again if one of the
 * moves fails. false: nothing moved. No statistics: the caller's to count. */
bool os_move(void *from, size_t size, void *to, size_t granule);

/* A full memory barrier on every running thread of the process (membarrier's private expedited command);
 * false where the kernel refuses it. The caller's side of an asymmetric fence: the other side needs only a
 * compiler barrier (sweep.c). */
bool os_fence_all_threads(void);
/* The process's registration for os_fence_all_threads, made ahead of its first use (process_init; a forked
 * child's address space inherits it): the kernel makes it at once while the process has one thread, and
 * past that waits for an RCU grace period, milliseconds, which a first sweep spent holding another
 * thread's heap while that thread waited (os_fence_all_threads still registers if this could not).
 * false where the kernel refuses it. */
bool os_fence_register(void);

/* Let another thread run (sched_yield). */
void os_yield(void);

/* Lock m, waiting at most about ms milliseconds; true when it is held. */
bool os_mutex_lock_timed(pthread_mutex_t *m, unsigned ms);

uint64_t os_now_ms(void);
/* The calling thread's CPU time in ms and how many times it blocked (voluntary context switches), from
 * getrusage(RUSAGE_THREAD); false if the kernel will not say. */
bool os_thread_usage(uint64_t *cpu_ms, uint64_t *blocked);
uint64_t os_random(void);
/* The environment variable, or NULL; NULL as well in setuid/setgid programs (AT_SECURE). Before libc has
 * set environ, read from /proc/self/environ (THREADHEAP_ variables only). */
const char *os_getenv(const char *name);
/* false until the environment can be read: libc has set environ, or /proc/self/environ was read. */
bool os_environment_known(void);
/* Write to stderr with no allocation. */
void os_write_err(const char *s, size_t n);
/* Create or truncate the file at path and write s to it, with no allocation; false on failure. */
bool os_write_file(const char *path, const char *s, size_t n);
/* Keep a copy of stderr (close-on-exec, at fd 100 or above) for os_write_err_late. */
void os_keep_stderr(void);
/* Write to stderr at exit: to the copy os_keep_stderr took when the program has closed fd 2 (coreutils
 * close it in their exit handlers, which run before the library's) and the copy is still the same file. */
void os_write_err_late(const char *s, size_t n);
/* The calling process's id. */
long os_process_id(void);
/* The calling thread's Linux id. */
uint32_t os_thread_tid(void);
/* The name of thread tid of this process (/proc/self/task/<tid>/comm) into name[16], NUL-padded; empty
 * when the thread is gone. No allocation. */
void os_thread_name(uint32_t tid, char name[16]);
/* Copy n bytes at src into dst without faulting when src is not mapped (any more): the bytes copied, fewer
 * than n (0 on failure) where the range ends in unmapped memory. For reading segments that other threads may
 * unmap meanwhile (the attribution walk). */
size_t os_read_self(void *dst, const void *src, size_t n);
/* Which OS pages of [p, p + size) are resident (mincore): vec, when not NULL, gets a byte per page (bit 0 set:
 * resident), size / os_page_size() of them; the resident bytes are returned. p is page-aligned. A part of the
 * range not mapped (any more) counts as not resident. */
size_t os_resident(const void *p, size_t size, uint8_t *vec);
uint64_t os_realtime_ns(void);
/* The live export's file: created (0600, replacing a dead process's file of the same name) and mapped
 * shared, size bytes; NULL on failure. */
void *os_export_open(const char *path, size_t size);
void os_export_remove(const char *path);
_Noreturn void os_abort(void);

/* For heap profiles (profile.c, profile_write.c). */
/* size bytes of address space, readable and writable, committed only as touched; NULL on failure. */
void *os_reserve_rw(size_t size);
/* The executable segment of the loaded object that holds addr, unless that object is the program itself
 * (then *lo == *hi == 0). */
void os_code_range(uintptr_t addr, uintptr_t *lo, uintptr_t *hi);
/* A file created (or truncated) for writing: its descriptor, or -1 with errno set. */
int os_file_create(const char *path);
bool os_file_write(int fd, const void *buf, size_t n);
/* Closed; false if an earlier write or the close failed to reach the file. */
bool os_file_close(int fd);
/* Up to cap bytes of a file (for /proc/self/maps): how many were read; 0 on failure. */
size_t os_read_file(const char *path, char *buf, size_t cap);
/* The GNU build id (hex, NUL-terminated in out[0..80]) of the loaded object mapped at addr; false if none. */
bool os_build_id(uintptr_t addr, char out[81]);
/* handler runs on SIGUSR2, installed only if the program has none: false otherwise. */
bool os_on_sigusr2(void (*handler)(int));
/* fn runs with every signal blocked in the calling thread (async-signal-safe). */
void os_without_signals(void (*fn)(void));
void os_sleep_ms(unsigned ms);

#endif
