#!/usr/bin/env bash
# Issue 41 through dankserve's daemon on the GPU machine with real vLLM 0.26.0 (snapshot_daemon.py), in
# back-to-back device calls from the repo root (the machine is wiped 30 s after a call; 64 MiB a call):
#
#   snapshot_daemon.sh 1         (carry .dev/b1 .dev/b4)  CRIU, vLLM's first part, dankserve's missing wheels
#   snapshot_daemon.sh 2         (carry .dev/b2)          vLLM's second part
#   snapshot_daemon.sh 3 8b [STEPS]  (carry .dev/b3)      vLLM installed, the model built (make_qwen3.py), then
#                                snapshot_daemon.py STEPS (default all); $OUT gets its results and logs
#   snapshot_daemon.sh run 14b [STEPS]   the same on a warm machine (after 3)
#
# .dev/b1..b3 are snapshot_by_hand/stage.sh's bundles; .dev/b4 holds dankserve's dependencies the machine's
# image lacks (podman, structlog, tenacity: `pip download --no-deps --only-binary=:all: --python-version 3.12`).
# Rehearsed on a CPU machine first: bench/real_vllm/rehearse.py snapshot.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
step=$1
shift

setup_env() {
  export PYTHONPATH=/tmp/site:/tmp/dsite:$root PYTHONUNBUFFERED=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1
}

run() {
  local size=${1:-8b} steps=${2:-all}
  setup_env
  # CRIU 4.2.1 as `make system-deps` builds it, unpacked by stage 1: found on PATH, as dankserve looks for it.
  if [ ! -x /usr/local/bin/criu ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/criu/lib exec /tmp/criu/criu "$@"\n' > /usr/local/bin/criu
    chmod 0755 /usr/local/bin/criu
  fi
  sysctl -w kernel.io_uring_disabled=2 >/dev/null || echo "cannot disable io_uring"
  python3 -c 'import cuda.bindings, importlib.metadata as m; print("cuda-bindings", m.version("cuda-bindings"))'
  criu --version | head -1
  if [ ! -f "/tmp/q$size/config.json" ]; then
    local s0=$SECONDS
    python3 "$here/make_qwen3.py" "/tmp/q$size" "$size" > "$OUT/make-$size.log" 2>&1 || { tail -5 "$OUT/make-$size.log"; exit 1; }
    echo "model $size built in $((SECONDS - s0)) s"
  fi
  export SNAPD_WORK=/tmp/snapd-$size SNAPD_MODEL=/tmp/q$size SNAPD_LABEL=$size SNAPD_EXECUTABLE=$(command -v python3)
  mkdir -p "$OUT/$size"
  OUT="$OUT/$size" timeout "${BUDGET:-480}" python3 "$here/snapshot_daemon.py" "$steps"
  echo "rc $?"
  ss -tanp 2>/dev/null | grep -E "python|vllm|VLLM" | head -20 > "$OUT/$size/sockets.txt" || true
  du -sh "$SNAPD_WORK/state/snapshots" 2>/dev/null
  tail -c 200000 "$SNAPD_WORK/state/snapshots/.chat.criu.log" > "$OUT/$size/criu.log" 2>/dev/null || true
}

case $step in
1)
  bash "$here/snapshot_by_hand/stage.sh" 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/dsite "$root"/.dev/b4/*.whl
  PYTHONPATH=/tmp/dsite python3 -c 'import podman, structlog, tenacity; print("dankserve deps ok")'
  ;;
2)
  bash "$here/snapshot_by_hand/stage.sh" 2
  ;;
3)
  bash "$here/snapshot_by_hand/stage.sh" 3
  run "$@"
  ;;
run)
  run "$@"
  ;;
*)
  echo "usage: snapshot_daemon.sh 1|2|3 SIZE [STEPS]|run SIZE [STEPS]" >&2
  exit 2
  ;;
esac
