#!/usr/bin/env bash
# The snapshot proof's device wrapper (issue 44, items 1-3; bench/real_vllm/snapshot_proof.py).
#
#   snapshot_proof.sh pack              here, as root after `make system-deps`: the CRIU binary and the
#                                       shared libraries it needs beyond glibc into .snap/ (git-ignored,
#                                       14 MB), to carry to the GPU machine
#   snapshot_proof.sh run [ARGS...]     there (carry .snap, and vLLM as bench/real_vllm/on_gpu.sh sets it
#                                       up): CRIU from .snap on PATH, io_uring off for the server (CRIU
#                                       cannot dump it), then snapshot_proof.py ARGS with its rows and
#                                       logs in $OUT (snapshot.json, server.log, the CRIU logs)
#   snapshot_proof.sh rehearse          here: the same run on the stand-in vLLM (no GPU; PYTHON=.venv/bin/python)
#
# First call on the machine: `snapshot_proof.sh run check,roundtrip` (gVisor cannot run CRIU: the
# check row says so and the run stops), then `run serve --model /tmp/qwen3-8b` (8B, process runtime).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
snap=$repo/.snap
OUT=${OUT:-/tmp/snapshot-proof}

case "${1:-}" in
  pack)
    criu=$(command -v criu || echo /usr/local/sbin/criu)
    [ -x "$criu" ] || { echo "no criu here: run make system-deps as root" >&2; exit 3; }
    rm -rf "$snap" && mkdir -p "$snap/bin" "$snap/lib"
    cp "$criu" "$snap/bin/criu"
    # Everything ldd names except glibc's own (the GPU machine's glibc is newer than Debian 12's).
    ldd "$criu" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux)[.-]' |
      while read -r lib; do cp -L "$lib" "$snap/lib/"; done
    du -sh "$snap"
    ;;
  run)
    shift
    export PATH=$snap/bin:$PATH LD_LIBRARY_PATH=$snap/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    sysctl -w kernel.io_uring_disabled=2 >/dev/null 2>&1 || echo "kernel.io_uring_disabled not settable here"
    mkdir -p "$OUT"
    "${PYTHON:-python3}" "$here/snapshot_proof.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/proof.log"
    cp "$OUT"/images/*.log "$OUT/" 2>/dev/null || true
    rm -rf "$OUT/images"  # the snapshot itself holds the server's memory: never sent back
    ;;
  rehearse)
    shift
    OUT=${OUT:-/tmp/snapshot-proof}
    "${PYTHON:-python3}" "$here/snapshot_proof.py" --stand-in --out "$OUT" "${@:-all}"
    rm -rf "$OUT/images"
    ;;
  *)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
