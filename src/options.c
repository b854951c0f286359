/* options.c: the THREADHEAP_* environment options, in one table, read once by options_init; and th_version. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* Defaults hold until options_init runs: from process_init, at the first heap made (or the library
 * constructor, if that comes first), so that threads started before any constructor ran (from a program's
 * .preinit_array) get heaps of the chosen mode too. Before libc has set environ, os_getenv reads the
 * environment from /proc. A build with -DTH_SECURE_DEFAULT=ON is in secure mode from the first allocation. */
#ifndef TH_SECURE_DEFAULT
#define TH_SECURE_DEFAULT 0
#endif
th_options_t th_options = {
    .purge_delay = 50,
    .cache_max = 512L << 20,
    .show_stats = 0,
    .verbose = 0,
    .huge_pages = 0,
    .stats_pid = 0,
    .stats_interval = 0,
    .remote_pairs = -1,
    .stats_file = NULL,
    .profile_path = NULL,
    .profile_rate = 512L << 10,
    .profile_interval = 0,
    .profile_signal = 0,
    .leaks = 0,
    .secure = TH_SECURE_DEFAULT,
    .lazy_commit = -1,
    .page_pool = 1,
};

typedef struct option_desc_s {
  const char *name;  /* THREADHEAP_<NAME> */
  long *value;       /* a number, or NULL for a text option */
  long min, max;
  bool has_unit;     /* accepts a K, M or G suffix */
  const char **text; /* a text option: set to a copy of the value, taken at init */
} option_desc_t;

static const option_desc_t option_table[] = {
    {"THREADHEAP_PURGE_DELAY", &th_options.purge_delay, 0, 3600L * 1000, false, NULL},
    {"THREADHEAP_CACHE_MAX", &th_options.cache_max, 0, 1L << 46, true, NULL},
    {"THREADHEAP_SHOW_STATS", &th_options.show_stats, 0, 1, false, NULL},
    {"THREADHEAP_VERBOSE", &th_options.verbose, 0, 2, false, NULL},
    {"THREADHEAP_HUGE_PAGES", &th_options.huge_pages, 0, 1, false, NULL},
    {"THREADHEAP_STATS_PID", &th_options.stats_pid, 0, 1L << 31, false, NULL},
    {"THREADHEAP_STATS_FILE", NULL, 0, 0, false, &th_options.stats_file},
    {"THREADHEAP_STATS_INTERVAL", &th_options.stats_interval, 0, 3600L * 1000, false, NULL},
    {"THREADHEAP_REMOTE_PAIRS", &th_options.remote_pairs, 0, 1, false, NULL},
    {"THREADHEAP_PROFILE", NULL, 0, 0, false, &th_options.profile_path},
    {"THREADHEAP_PROFILE_RATE", &th_options.profile_rate, 1, 1L << 40, true, NULL},
    {"THREADHEAP_PROFILE_INTERVAL", &th_options.profile_interval, 0, 86400L * 365, false, NULL},
    {"THREADHEAP_PROFILE_SIGNAL", &th_options.profile_signal, 0, 1, false, NULL},
    {"THREADHEAP_LEAKS", &th_options.leaks, 0, 1, false, NULL},
    {"THREADHEAP_SECURE", &th_options.secure, 0, 2, false, NULL},
    {"THREADHEAP_LAZY_COMMIT", &th_options.lazy_commit, 0, 1, false, NULL},
    {"THREADHEAP_PAGE_POOL", &th_options.page_pool, 0, 1, false, NULL},
};

/* Copies of the text options: the program may later rewrite its environment (setproctitle does). */
static char text_pool[4096];
static size_t text_used;

static bool copy_text(const char *text, const char **out) {
  size_t n = strlen(text) + 1;
  if (n == 1 || n > sizeof text_pool - text_used) return false;
  memcpy(text_pool + text_used, text, n);
  *out = text_pool + text_used;
  text_used += n;
  return true;
}

static void warn_option(const char *name, const char *text) {
  char line[256];
  size_t n = 0;
  const char *parts[] = {"threadheap: ignoring malformed ", name, "='", text, "'; keeping the default\n"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    for (const char *s = parts[i]; *s && n < sizeof line - 2; s++) line[n++] = *s;
  }
  if (line[n - 1] != '\n') line[n++] = '\n';
  os_write_err(line, n);
}

/* Parse a decimal number with an optional K/M/G suffix, or the words on/off/true/false/yes/no. */
static bool parse_value(const char *s, bool has_unit, long *out) {
  if (!strcmp(s, "on") || !strcmp(s, "true") || !strcmp(s, "yes")) return *out = 1, true;
  if (!strcmp(s, "off") || !strcmp(s, "false") || !strcmp(s, "no")) return *out = 0, true;
  if (*s < '0' || *s > '9') return false;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (has_unit && *end) {
    int shift = (*end == 'K' || *end == 'k') ? 10 : (*end == 'M' || *end == 'm') ? 20
              : (*end == 'G' || *end == 'g') ? 30 : -1;
    if (shift < 0 || v > (1L << (62 - shift))) return false;
    v <<= shift;
    end++;
    if (*end == 'i' && end[1] == 'B') end += 2; /* KiB, MiB, GiB */
    else if (*end == 'B') end++;
  }
  if (*end != '\0') return false;
  *out = v;
  return true;
}

void options_verbose(const char *fmt, ...) {
  if (!th_options.verbose) return;
  int saved = errno;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line + 12, sizeof line - 13, fmt, ap); /* snprintf of numbers and strings: no malloc */
  va_end(ap);
  if (n >= 0) {
    memcpy(line, "threadheap: ", 12);
    size_t len = 12 + ((size_t)n < sizeof line - 14 ? (size_t)n : sizeof line - 14);
    line[len++] = '\n';
    os_write_err(line, len);
  }
  errno = saved;
}

/* The header's three numbers as text, made by the preprocessor: no copy of the version to keep in step. */
#define TH_TEXT(x) #x
#define TH_VERSION_TEXT(major, minor, patch) TH_TEXT(major) "." TH_TEXT(minor) "." TH_TEXT(patch)

const char *th_version(void) {
  return TH_VERSION_TEXT(TH_VERSION_MAJOR, TH_VERSION_MINOR, TH_VERSION_PATCH);
}

/* THREADHEAP_VERBOSE: the version, the process and every option's value in effect, on one line. */
static void print_options(void) {
  if (!th_options.verbose) return;
  char line[640];
  size_t n = 0;
  for (size_t i = 0; i < sizeof option_table / sizeof option_table[0] && n < sizeof line; i++) {
    const option_desc_t *o = &option_table[i];
    const char *name = o->name + sizeof "THREADHEAP_" - 1;
    int w = o->value ? snprintf(line + n, sizeof line - n, " %s=%ld", name, *o->value)
                     : snprintf(line + n, sizeof line - n, " %s=%s", name, *o->text ? *o->text : "-");
    if (w > 0) n += (size_t)w;
  }
  options_verbose("version %s, pid %ld, options:%s", th_version(), os_process_id(), line);
}

/* Read once the environment is known; a read before that (no /proc) is done again by the constructor. */
static bool options_read;

void options_init(void) {
  if (options_read) return;
  th_options.remote_pairs = -1; /* its default follows others: decided again on a second read */
  th_options.lazy_commit = -1;
  for (size_t i = 0; i < sizeof option_table / sizeof option_table[0]; i++) {
    const option_desc_t *o = &option_table[i];
    const char *text = os_getenv(o->name);
    if (text == NULL) continue;
    long v;
    if (o->value == NULL) {
      if (!copy_text(text, o->text)) warn_option(o->name, text);
    } else if (!parse_value(text, o->has_unit, &v) || v < o->min || v > o->max) {
      warn_option(o->name, text);
    } else {
      *o->value = v;
    }
  }
  /* Who frees whose memory costs the remote free path a call (docs/design.md): counted by default only where
   * someone will look, with the live export or the statistics at exit. */
  if (th_options.remote_pairs < 0) th_options.remote_pairs = th_options.stats_interval > 0 || th_options.show_stats;
  /* Under strict overcommit segments are charged as their pages are carved, not whole (segment.c, "lazy
   * commit"). */
  if (th_options.lazy_commit < 0) th_options.lazy_commit = os_overcommit_strict();
  options_read = os_environment_known();
}

/* THREADHEAP_VERBOSE's first line, from the library constructor (snprintf waits for libc to be ready). */
void options_print(void) { print_options(); }
