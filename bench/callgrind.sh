#!/usr/bin/env bash
# bench/callgrind.sh: instructions per malloc+free (or new+delete) pair, per allocator and size, counted with callgrind.
#
# For each allocator and size the `pairs` workload runs twice under valgrind --tool=callgrind: N pairs and
# N/2 pairs. The difference of the two instruction totals over N/2 cancels everything but the pairs
# themselves (start-up, the allocator's initialization, exit). Instruction counts are exact and immune to
# the noise of a shared machine, which is why they complement the timed runs.
#
# usage: bash bench/callgrind.sh [N]        (default N = 200000)
# env:   BUILD (default build), TH_LIB (default $BUILD/libthreadheap.so), SIZES (default "16 32 64 128 256 512 1024"),
#        API (malloc, the default: malloc+free; new: C++'s operator new and sized delete, pairs --new;
#        realloc: malloc, a realloc to 8 bytes fewer, free; grow: the same with a realloc to twice the size;
#        usable: malloc, malloc_usable_size, free;
#        calloc: calloc(1, size) and free)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
n=${1:-200000}
sizes=${SIZES:-"16 32 64 128 256 512 1024"}
api=${API:-malloc}
case "$api" in malloc) api_flag=() pair="malloc+free" ;; new) api_flag=(--new) pair="new+delete" ;;
  realloc) api_flag=(--realloc) pair="malloc+realloc+free" ;; grow) api_flag=(--grow) pair="malloc+realloc(2x)+free" ;; usable) api_flag=(--usable) pair="malloc+usable_size+free" ;;
  calloc) api_flag=(--calloc) pair="calloc+free" ;;
  *) echo "callgrind.sh: API must be malloc, new, realloc, grow, usable or calloc, not $api" >&2; exit 2 ;; esac
exe="$build/bin/pairs"
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind not installed (apt-get install valgrind)" >&2; exit 2; }
[ -x "$exe" ] || { echo "callgrind.sh: $exe not found (run make)" >&2; exit 2; }

find_lib() { ldconfig -p | awk -v s="$1" '$1 == s && /x86-64/ { print $NF; exit }'; }
declare -A lib=([threadheap]="${TH_LIB:-$build/libthreadheap.so}" [glibc]=""
                [mimalloc]="$(find_lib libmimalloc.so.2)" [jemalloc]="$(find_lib libjemalloc.so.2)"
                [tcmalloc]="$(find_lib libtcmalloc_minimal.so.4)")
order=(threadheap glibc mimalloc jemalloc tcmalloc)

# Total instructions of one run: callgrind prints "Collected : <Ir>" on stderr.
count() { # lib size pairs
  local out
  out=$(LD_PRELOAD="$1" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$exe" --count "$3" --size "$2" "${api_flag[@]}" 2>&1) ||
    { echo "callgrind.sh: run failed: $out" >&2; return 1; }
  sed -n 's/.*Collected : *\([0-9]*\).*/\1/p' <<<"$out" | tail -1
}

printf '%-12s' "bytes"
for a in "${order[@]}"; do printf '%12s' "$a"; done
printf '\n'
for s in $sizes; do
  printf '%-12s' "$s"
  for a in "${order[@]}"; do
    l=${lib[$a]}
    if [ "$a" != glibc ] && { [ -z "$l" ] || [ ! -e "$l" ]; }; then printf '%12s' "-"; continue; fi
    full=$(count "$l" "$s" "$n") half=$(count "$l" "$s" $((n / 2)))
    awk -v f="$full" -v h="$half" -v n="$n" 'BEGIN { printf "%12.1f", (f - h) / (n / 2) }'
  done
  printf '\n'
done
echo "(instructions per $pair; N=$n, difference of N and N/2 pairs)"
