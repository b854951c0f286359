#!/bin/sh
# test_exports.sh LIB: the shared library exports threadheap's own th_* interface and the standard
# allocation names it replaces, and nothing else; a stray export would interpose on, or collide with, a
# symbol of the program that loads the library. It must export every name it replaces (so the check cannot
# pass on an empty or unreadable symbol table, and a dropped override is caught).
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
    malloc_usable_size|malloc_trim|mallinfo|mallinfo2|malloc_stats|malloc_info|mallopt|cfree) ok=1 ;;
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
# The whole glibc interface, its __libc_ aliases, and the 20 forms of operator new and delete (C++17); and
# th_version, which `threadheap --version` calls.
required_names="th_malloc th_free th_version
  malloc free calloc realloc reallocarray aligned_alloc posix_memalign memalign
  valloc pvalloc malloc_usable_size malloc_trim mallinfo mallinfo2 malloc_stats malloc_info mallopt
  __libc_malloc __libc_free __libc_calloc __libc_realloc __libc_memalign __libc_valloc __libc_pvalloc
  __libc_mallinfo __libc_mallopt
  _Znwm _Znam _ZnwmRKSt9nothrow_t _ZnamRKSt9nothrow_t _ZnwmSt11align_val_t _ZnamSt11align_val_t
  _ZnwmSt11align_val_tRKSt9nothrow_t _ZnamSt11align_val_tRKSt9nothrow_t
  _ZdlPv _ZdaPv _ZdlPvRKSt9nothrow_t _ZdaPvRKSt9nothrow_t _ZdlPvm _ZdaPvm _ZdlPvSt11align_val_t
  _ZdaPvSt11align_val_t _ZdlPvSt11align_val_tRKSt9nothrow_t _ZdaPvSt11align_val_tRKSt9nothrow_t
  _ZdlPvmSt11align_val_t _ZdaPvmSt11align_val_t"
for required in $required_names; do
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
