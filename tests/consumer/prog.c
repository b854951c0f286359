/* A program that uses an installed threadheap (tests/test_install.sh, tests/test_deb.sh): malloc must be
 * threadheap's (th_usable_size stops the process on a pointer it did not return), and so must the calloc and
 * realloc that libc calls inside open_memstream. It calls only malloc and free itself, so a static copy
 * linked without --whole-archive would leave libc's calloc and realloc in place, and it would fail. It
 * prints th_version(), which must match the installed header's numbers. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threadheap.h>
int main(void) {
  char *p = malloc(100);
  void *q = th_malloc(5000);
  if (p == NULL || q == NULL || th_usable_size(p) < 100 || th_usable_size(q) < 5000) return 1;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL) return 3;
  for (int i = 0; i < 20000; i++) fputs("0123456789", f);
  if (fclose(f) != 0 || len != 200000 || th_usable_size(buf) < len) return 4;
  free(buf);
  char header[64];
  snprintf(header, sizeof header, "%d.%d.%d", TH_VERSION_MAJOR, TH_VERSION_MINOR, TH_VERSION_PATCH);
  if (strcmp(header, th_version()) != 0) return 5;
  strcpy(p, "installed");
  th_stats_t s;
  th_stats_get(&s);
  if (s.committed == 0) return 2;
  printf("%s %s\n", p, th_version());
  free(p);
  th_free(q);
  return 0;
}
