#!/bin/sh
# test_exports.sh LIB: the shared library exports threadheap's own th_* interface and the standard
# allocation names it replaces, and nothing else; a stray export would interpose on, or collide with, a
# symbol of the program that loads the library. It must export th_malloc and malloc, so that the check
# cannot pass on an empty or unreadable symbol table.
set -u
lib=${1:?usage: test_exports.sh path/to/libthreadheap.so}
if [ ! -r "$lib" ]; then
  echo "cannot read $lib"
  echo "0 passed, 1 failed"
  exit 1
fi
syms=$(nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' | sort -u)
if [ -z "$syms" ]; then
  echo "nm found no exported symbols in $lib"
  echo "0 passed, 1 failed"
  exit 1
fi
pass=0
fail=0
for s in $syms; do
  case "$s" in
    th_*) ok=1 ;;
    malloc|free|calloc|realloc|reallocarray|aligned_alloc|posix_memalign|memalign|valloc|pvalloc) ok=1 ;;
    malloc_usable_size|malloc_trim|mallinfo|mallinfo2|malloc_stats|mallopt|cfree) ok=1 ;;
    __libc_malloc|__libc_free|__libc_calloc|__libc_realloc|__libc_memalign|__libc_valloc|__libc_pvalloc) ok=1 ;;
    __libc_reallocarray|__libc_aligned_alloc|__libc_posix_memalign|__libc_malloc_usable_size) ok=1 ;;
    __libc_mallinfo|__libc_mallinfo2|__libc_mallopt|__libc_malloc_trim|__libc_malloc_stats|__libc_cfree) ok=1 ;;
    *) if printf '%s\n' "$s" | grep -Eq '^_Zn[wa]m|^_Zd[la]Pv'; then ok=1; else ok=0; fi ;;
  esac
  if [ "$ok" = 1 ]; then
    pass=$((pass + 1))
  else
    echo "unexpected export: $s"
    fail=$((fail + 1))
  fi
done
for required in th_malloc th_free malloc free; do
  if printf '%s\n' "$syms" | grep -qx "$required"; then
    pass=$((pass + 1))
  else
    echo "missing export: $required"
    fail=$((fail + 1))
  fi
done
echo "$(printf '%s\n' "$syms" | wc -l) exported symbols checked"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
