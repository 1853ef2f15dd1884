#!/usr/bin/env bash
# Copy this machine's bubblewrap and the libraries it links into .kfuse-cache/bwrap/, for a GPU machine that
# has no bwrap and no network: carry .kfuse-cache/bwrap there; gpu_throughput.sh puts it on PATH.
set -euo pipefail
dest="$PWD/.kfuse-cache/bwrap"
mkdir -p "$dest/lib"
real="$(command -v bwrap)"
cp "$real" "$dest/bwrap.real"
for lib in $(ldd "$real" | awk '/=> \// {print $3}'); do
    case "$(basename "$lib")" in libc.so.*|ld-linux*) ;; *) cp "$lib" "$dest/lib/" ;; esac
done
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/lib" exec "%s/bwrap.real" "$@"\n' "$dest" "$dest" > "$dest/bwrap"
chmod +x "$dest/bwrap"
echo "$dest: $(ls "$dest" "$dest/lib" | tr '\n' ' ')"
