#!/bin/bash
# The C side of railcc's libnccl (issue 7), no GPU needed: the library exports every symbol of
# tests/symbols.txt, a C program builds against include/nccl.h, links to libnccl.so.2 and
# gets clean errors where a GPU would be needed.
# Usage: bash nccl-compat/tests/c_api.sh [target dir with libnccl.so] [driver [GPU count]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lib=${1:-$here/../../target/debug}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A cargo target dir holds libnccl.so; a staged one (.device/lib) libnccl.so.2.
if [ -e "$lib/libnccl.so" ]; then cp "$lib/libnccl.so" "$work/libnccl.so.2"; else cp "$lib/libnccl.so.2" "$work/libnccl.so.2"; fi
ln -s libnccl.so.2 "$work/libnccl.so"
soname=$(readelf -d "$work/libnccl.so.2" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libnccl.so.2 ] || { echo "FAIL: soname is '$soname', not libnccl.so.2"; exit 1; }
nm -D --defined-only "$work/libnccl.so.2" | awk '{print $NF}' | sort > "$work/exported"
missing=$(grep -v '^#' "$here/symbols.txt" | sort | comm -23 - "$work/exported")
[ -z "$missing" ] || { echo "FAIL: libnccl.so.2 does not export: $missing"; exit 1; }
echo "symbols: all $(grep -vc '^#' "$here/symbols.txt") exported"
cc -Wall -Werror -I "$here/../include" "$here/c_api.c" -L "$work" -lnccl -ldl -o "$work/c_api"
LD_LIBRARY_PATH="$work" "$work/c_api" ${2:-} ${3:-}
