#!/usr/bin/env bash
# Issue 44 item 4 on the device: the 8B and the 14B taking turns with suspended sleeps (swap_suspend.py).
set -u
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=/tmp/site:$here VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1
for size in 8b 14b; do
  [ -f /tmp/q$size/config.json ] || { s0=$SECONDS; python3 "$here/../make_qwen3.py" /tmp/q$size $size > "$OUT/make-$size.log" 2>&1; echo "model $size built in $((SECONDS-s0)) s"; }
done
sysctl -w kernel.io_uring_disabled=2 || echo "cannot disable io_uring"
export SERVE_ARGS="--attention-backend TRITON_ATTN --max-model-len 4096" UTIL=${UTIL:-0.4} SWAPS=${SWAPS:-5}
cd "$here" && timeout ${BUDGET:-540} python3 swap_suspend.py /tmp/q8b 8b /tmp/q14b 14b
echo "rc $?"
for f in "$OUT"/swap-*.log; do tail -c 100000 "$f" > "$f.tail"; rm -f "$f"; done
