#!/usr/bin/env bash
# Issue 44 on the device: the 8B (Qwen3 shape, random weights) by hand: cold, manual best, capture, restores.
set -u
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=/tmp/site:$here VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 LD_LIBRARY_PATH=/tmp/criu/lib
size=${1:-8b}
[ -f /tmp/q$size/config.json ] || { s0=$SECONDS; python3 "$here/../make_qwen3.py" /tmp/q$size $size > "$OUT/make-$size.log" 2>&1; echo "model $size built in $((SECONDS-s0)) s"; }
sysctl -w kernel.io_uring_disabled=2 || echo "cannot disable io_uring"
export CRIU=/tmp/criu/criu SNAP_DIR=/dev/shm/snap REPEATS=${REPEATS:-3}
export SERVE_ARGS="--attention-backend TRITON_ATTN --max-model-len 4096 --gpu-memory-utilization ${UTIL:-0.6}"
timeout ${BUDGET:-540} python3 "$here/vllm_snap.py" /tmp/q$size $size 8011
rc=$?
tail -c 200000 "$OUT/$size-server.log" > "$OUT/$size-server.tail" 2>/dev/null; rm -f "$OUT/$size-server.log"
for f in /dev/shm/snap/$size/dump.log /dev/shm/snap/$size/restore.log; do [ -f $f ] && tail -c 300000 $f > "$OUT/$size-$(basename $f)"; done
du -sh /dev/shm/snap/$size 2>/dev/null
echo "rc $rc"
