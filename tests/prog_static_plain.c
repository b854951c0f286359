/* prog_static_plain: linked against libthreadheap.a plainly (no --whole-archive). It calls only malloc and
 * free itself; getline grows its line with libc's calls to realloc, which must be threadheap's too, or the
 * final free would stop the process with "invalid pointer". Exit 0 and the line length on success. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  char *p = malloc(10);
  free(p);
  FILE *f = tmpfile();
  if (f == NULL) return 2;
  for (int i = 0; i < 5000; i++) fputc('x', f);
  fputc('\n', f);
  rewind(f);
  char *line = NULL;
  size_t cap = 0;
  ssize_t n = getline(&line, &cap, f);
  free(line);
  fclose(f);
  printf("%zd\n", n);
  return n == 5001 ? 0 : 1;
}
