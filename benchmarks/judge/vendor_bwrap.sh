#!/usr/bin/env bash
# Copy this machine's bubblewrap (and prlimit) with the libraries they link into out/bwrap/ (ignored by git),
# for a GPU machine that has neither and no network: carry out/bwrap there; gpu_throughput.sh puts it on PATH.
set -euo pipefail
dest="$PWD/out/bwrap"
mkdir -p "$dest/lib"
for tool in bwrap prlimit; do
    real="$(command -v "$tool")"
    cp "$real" "$dest/$tool.real"
    for lib in $(ldd "$real" | awk '/=> \// {print $3}'); do
        case "$(basename "$lib")" in libc.so.*|ld-linux*) ;; *) cp "$lib" "$dest/lib/" ;; esac
    done
    # the wrapper finds the libraries next to it, wherever the folder is carried
    printf '#!/bin/sh\nd="$(dirname "$0")"\nLD_LIBRARY_PATH="$d/lib" exec "$d/%s.real" "$@"\n' "$tool" > "$dest/$tool"
    chmod +x "$dest/$tool"
done
echo "$dest: $(ls "$dest" "$dest/lib" | tr '\n' ' ')"
