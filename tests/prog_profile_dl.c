/* prog_profile_dl.c: a library prog_profile loads with dlopen; dl_site keeps 16 MiB. */
#include <stdlib.h>
#include <string.h>

static void *kept[256];

__attribute__((noipa)) void *dl_alloc(size_t n) {
  void *p = malloc(n);
  if (p) memset(p, 1, n);
  return p;
}

void dl_site(void) {
  for (int i = 0; i < 256; i++) kept[i] = dl_alloc((size_t)64 << 10);
}
