#!/usr/bin/env bash
# The issue-13 run on the GPU test machine, in back-to-back device calls (the machine is wiped
# 30 s after a call; a call carries at most 64 MiB), from the repo root, as root:
#
#   on_gpu.sh podman   (carry .pod .dev)  Podman 4.3.1 + CDI spec (install-podman.sh), dankserve's
#                      own dependencies from .dev/whl, the Podman API service on
#                      /run/podman/podman.sock, and the base image import started in the background
#   on_gpu.sh vllm1    (carry .vl1)       vLLM 0.26.0, first half (install-on-gpu.sh 1)
#   on_gpu.sh vllm2 STEPS  (carry .vl2)   second half + the random-weight model, the image layer
#                      (build_image.sh vllm), then proof.py STEPS with PROOF_RUNTIME=podman in the
#                      background; watches it until SECONDS_LEFT and leaves partial results in $OUT
#   on_gpu.sh watch    follows the proof started earlier (a later call), same outputs
#
# Issues 15 and 16 with the process runtime (no Podman), the same way:
#   on_gpu.sh proc1    (carry .vl1 .dev)  dankserve's dependencies, vLLM's first half, the env file
#   on_gpu.sh proc2 JOB...  (carry .vl2)  second half + the model, then each JOB (a shell command
#                      line, run in order in the background: launcher.py, swap.py) and watches them
#   on_gpu.sh jobs     follows those jobs (a later call); $OUT gets /tmp/results/* and the bundle
#
# Both runtimes in one lease (the podman step first, then vllm1, then):
#   on_gpu.sh vllm2jobs JOB...  (carry .vl2)  second half + the model + the image layer, then the
#                      JOBs as proc2 does; each JOB sets PROOF_RUNTIME/PROOF_WORK/PROOF_MODEL itself
#                      (the podman step's env file says podman).
#   on_gpu.sh vllm2early JOB...  (carry .vl2)  the same without waiting for the image: the base
#                      image's import (about 190 s) overlaps the first JOB; a Podman JOB comes after
#                      the JOB "bash bench/real_vllm/on_gpu.sh image" (waits for it, builds the layer).
#                      Issue 15's Podman figures (run F: every kind and the manual best three
#                      times in one run), about 11 min of device time in all:
#     "bash bench/real_vllm/on_gpu.sh image"
#     "PROOF_RUNTIME=podman PROOF_WORK=/tmp/proof python3 bench/real_vllm/launcher.py cold,launcher-kill,launcher-down-up,launcher-config-change,manual-best,stop"
#                      Run G, the same with the process runtime (about 8 min after proc1):
#     on_gpu.sh proc2 "python3 bench/real_vllm/launcher.py cold,launcher-kill,launcher-down-up,launcher-config-change,manual-best,stop"
#                      Rehearse both on a CPU machine first (bench/real_vllm/rehearse.py podman|process).
#                      Issue 30, an upgrade between two builds of the image (upgrade.py: the second is
#                      the first plus a label; each step, the outage, the rollback timed), about 5 min a room
#                      after the image (rehearse it first: bench/real_vllm/rehearse.py upgrade):
#     on_gpu.sh vllm2early "bash bench/real_vllm/on_gpu.sh image" "python3 bench/real_vllm/upgrade.py --out /tmp/results --rooms sleep,stop"
#                      With the split layout (vllm1's .vl1 is too large for one call), after the podman step:
#     on_gpu.sh sh 'mkdir -p /tmp/site/vllm && xz -T4 -dc .vl1/C.so.xz > /tmp/site/vllm/_C_stable_libtorch.abi3.so'  (carry .vl1/C.so.xz)
#     on_gpu.sh quick2   (carry .vl1/py.tar.xz .vl2/whl .dev/tree.tar.xz)
#     on_gpu.sh quick3 "[ -f /tmp/tinyllama/config.json ] || python3 bench/real_vllm/make_tiny_llama.py /tmp/tinyllama" \
#         "bash bench/real_vllm/on_gpu.sh image" "python3 bench/real_vllm/upgrade.py --out /tmp/results --rooms sleep,stop"
#                        (carry .vl2/fa3.xz .vl2/third_party.tar.xz)
#                      then `on_gpu.sh jobs` until it ends: $OUT gets upgrade.json (the rows),
#                      upgrade-requests-ROOM.json, upgrade-timeline-ROOM.json and upgrade-daemon-ROOM.log.
#                      Stop a stuck job by an anchored pattern (pkill -f '^python3 bench/real_vllm/launcher'):
#                      an unanchored one matches the device call's own command line and kills it.
#
# Issue 28 (real model sizes), from the coordinator's checkout, the code under test carried as
# .dev/tree.tar.xz (dankserve/ and bench/ of the branch) with dankserve's missing wheels in .dev/whl:
#   bash .dev/on_gpu.sh scale1           (carry .vl1 .dev/whl .dev/on_gpu.sh)  vLLM's first half, the env file
#   bash .dev/on_gpu.sh scale2 JOB...    (carry .vl2 .dev/tree.tar.xz .dev/on_gpu.sh)  second half, the 8B model
#                      (make_qwen3.py, /tmp/qwen3-8b), then the JOBs as proc2 does, e.g.
#     "python3 /tmp/tree/bench/real_vllm/launcher.py cold,launcher-kill,launcher-down-up,manual-best,summary --requests"
#   bash .dev/on_gpu.sh jobs             follows them (a later call); $OUT as for proc2
#   a JOB "bash .dev/on_gpu.sh memlog &" samples GPU and host memory into mem.txt (run I's swap-memory.txt)
# .dev/on_gpu.sh is a copy of this file (the device call sends the coordinator's checkout).
# When the checkout itself is large (a call carries 64 MiB, tracked files counted), three smaller calls
# instead, with the wheels of .vl2 moved into .vl2/whl:
#   bash .dev/on_gpu.sh split1      (carry .vl1/C.so.xz .dev/whl .dev/on_gpu.sh)  dankserve's wheels, env file, vLLM's kernels
#   bash .dev/on_gpu.sh split2      (carry .vl1/py.tar.xz .vl2/whl .dev/tree.tar.xz .dev/on_gpu.sh)  vLLM's Python and
#                      its dependencies, the tree; both models built in the background (/tmp/qwen3-8b, /tmp/qwen3-14b)
#   bash .dev/on_gpu.sh split3 JOB...  (carry .vl2/fa3.xz .vl2/third_party.tar.xz .dev/on_gpu.sh)  the rest, waits
#                      for the models, then the JOBs as scale2 does
#   quick2 / quick3 JOB...   split2 / split3 without the 8B and 14B (a short lease on the 1.1B test model)

# Everything the calls share lives under /tmp (gone with the machine). $OUT gets at most a few
# files: boots.json, results.json, progress.txt and bundle.tar.gz (logs, doctor, plan).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ENVFILE=/tmp/gpu-env.sh
WORK=/tmp/proof
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$WORK"

collect() {
  local dir=/tmp/collect
  rm -rf $dir && mkdir -p $dir
  cp "$WORK"/boots.json "$WORK"/results.json "$OUT"/ 2>/dev/null
  cp "$WORK"/*.log "$WORK"/plan.json "$WORK"/dankserve.toml /tmp/*.log $dir/ 2>/dev/null
  cp /tmp/out-extra/* $dir/ 2>/dev/null
  for f in "$WORK"/state/*.json; do [ -f "$f" ] && cp "$f" $dir/state-$(basename "$f"); done
  podman ps -a --format '{{.Names}} {{.Status}}' > $dir/podman-ps.txt 2>&1
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > $dir/nvidia-smi.txt 2>&1
  tar -C $dir -czf "$OUT/bundle.tar.gz" . 2>/dev/null
}

watch_proof() {
  local until=${DEADLINE:-$(( $(date +%s) + ${SECONDS_LEFT:-480} ))}
  while [ "$(date +%s)" -lt "$until" ]; do
    if ! pgrep -f "proof.py" >/dev/null; then echo "proof finished"; break; fi
    sleep 5
    tail -c 400 /tmp/proof-run.log > "$OUT/progress.txt" 2>/dev/null
  done
  tail -n 40 /tmp/proof-run.log
  collect
}

watch_jobs() {
  local until=${DEADLINE:-$(( $(date +%s) + ${SECONDS_LEFT:-480} ))}
  while [ "$(date +%s)" -lt "$until" ]; do
    if ! pgrep -f "run-jobs" >/dev/null; then echo "jobs finished"; break; fi
    sleep 5
    tail -c 600 /tmp/jobs.log > "$OUT/progress.txt" 2>/dev/null
  done
  tail -n 30 /tmp/jobs.log
  mkdir -p /tmp/out-extra /tmp/results
  cp /tmp/jobs.log /tmp/launcher/*.log /tmp/launcher/*.json /tmp/swapbench/*.log /tmp/out-extra/ 2>/dev/null
  cp /tmp/launcher/state/processes/*.log /tmp/out-extra/ 2>/dev/null
  for f in /tmp/swapbench/state/processes/*.log; do [ -f "$f" ] && cp "$f" "/tmp/out-extra/swap-$(basename "$f")"; done
  cp /tmp/models.log /tmp/out-extra/ 2>/dev/null
  find /tmp/results -type f | while read -r f; do cp "$f" "$OUT/$(echo "${f#/tmp/results/}" | tr / -)"; done
  collect
}

second_half() {
  local t0; t0=$(date +%s)
  bash "$here/install-on-gpu.sh" 2 | tail -2
  mkdir -p "$WORK/hf" && rm -rf "$WORK/hf/tinyllama" && mv /tmp/tinyllama "$WORK/hf/tinyllama"
  echo "vllm2 + model took $(( $(date +%s) - t0 )) s"
}

second_half_and_image() {
  second_half
  image_layer
}

image_layer() {
  while pgrep -f "build_image[.]sh base" >/dev/null; do sleep 2; done
  cat /tmp/base-image.log
  bash "$here/build_image.sh" vllm || { collect; exit 1; }
}

scale_env() {  # issue 28's env file: the carried tree's dankserve, the 8B by default
  cat > $ENVFILE <<ENV
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:/tmp/dsite:/tmp/tree VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export PROOF_RUNTIME=process PROOF_WORK=/tmp/launcher LAUNCHER_RESULTS=/tmp/results/launcher.json
export PROOF_MODEL=/tmp/qwen3-8b LAUNCHER_MODEL_NAME=qwen3-8b
export SWAP_PYTHON=$(command -v python3) SWAP_MACHINE="H200 VM (device kind nvidia-h200)"
ENV
}

start_jobs() {  # each argument a shell command line, run in order in the background
  mkdir -p /tmp/results
  # The branch's tree, not the checkout's: `python -m dankserve` puts the working directory first on
  # sys.path, so jobs started in the checkout ran its dankserve/ whatever PYTHONPATH said (runs J and K).
  if [ -d /tmp/tree/dankserve ]; then mkdir -p /tmp/tree/.dev && cp "$here/on_gpu.sh" /tmp/tree/.dev/ && cd /tmp/tree; fi
  { echo "set -x"; for job in "$@"; do echo "$job"; done; } > /tmp/run-jobs.sh
  setsid bash /tmp/run-jobs.sh > /tmp/jobs.log 2>&1 < /dev/null &
  watch_jobs
}

case "${1:-}" in
scale1)
  t0=$(date +%s)
  # The 64 MiB a call carries: scale1 may carry .dev/whl without .dev/tree.tar.xz (the checkout's own
  # install-on-gpu.sh then runs), scale2 the tree without the wheels (installed here, kept in /tmp).
  mkdir -p /tmp/tree/bench/real_vllm
  if [ -f .dev/tree.tar.xz ]; then xz -dc .dev/tree.tar.xz | tar -C /tmp/tree -xf -
  else cp bench/real_vllm/install-on-gpu.sh /tmp/tree/bench/real_vllm/; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/dsite .dev/whl/*.whl
  scale_env
  bash /tmp/tree/bench/real_vllm/install-on-gpu.sh 1
  nvidia-smi --query-gpu=index,uuid,memory.used --format=csv
  df -h /tmp | tail -1; free -g | head -2
  echo "scale1 took $(( $(date +%s) - t0 )) s"
  ;;
scale2)
  . $ENVFILE
  t0=$(date +%s)
  rm -rf /tmp/tree && mkdir -p /tmp/tree && xz -dc .dev/tree.tar.xz | tar -C /tmp/tree -xf -
  NO_TINY=1 bash /tmp/tree/bench/real_vllm/install-on-gpu.sh 2 | tail -2
  echo "vllm2 took $(( $(date +%s) - t0 )) s"
  [ -f /tmp/qwen3-8b/config.json ] || python3 /tmp/tree/bench/real_vllm/make_qwen3.py /tmp/qwen3-8b 8b 2>&1 | tail -3
  du -sh /tmp/qwen3-8b; df -h /tmp | tail -1
  echo "vllm2 + model took $(( $(date +%s) - t0 )) s"
  shift
  start_jobs "$@"
  ;;
split1)
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/dsite .dev/whl/*.whl
  scale_env
  mkdir -p /tmp/site/vllm && xz -T4 -dc .vl1/C.so.xz > /tmp/site/vllm/_C_stable_libtorch.abi3.so
  nvidia-smi --query-gpu=index,uuid,memory.used --format=csv
  df -h /tmp | tail -1; free -g | head -2; nproc
  echo "split1 took $(( $(date +%s) - t0 )) s"
  ;;
split2)
  t0=$(date +%s)
  (cd /tmp/site && xz -dc "$OLDPWD/.vl1/py.tar.xz" | tar -xf -)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .vl2/whl/*.whl 2>&1 | grep -v WARNING
  rm -rf /tmp/tree && mkdir -p /tmp/tree && xz -dc .dev/tree.tar.xz | tar -C /tmp/tree -xf -
  . $ENVFILE
  # In a session of its own: it outlives this call (the next call waits for it).
  setsid bash -c ". $ENVFILE; m=/tmp/tree/bench/real_vllm/make_qwen3.py; python3 \$m /tmp/qwen3-8b 8b &&
    python3 \$m /tmp/qwen3-14b 14b && echo built > /tmp/models.done" > /tmp/models.log 2>&1 < /dev/null &
  echo "split2 took $(( $(date +%s) - t0 )) s"
  ;;
split3)
  t0=$(date +%s)
  (cd /tmp/site && xz -dc "$OLDPWD/.vl2/third_party.tar.xz" | tar -xf -)
  xz -T4 -dc .vl2/fa3.xz > /tmp/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so
  . $ENVFILE
  while [ ! -f /tmp/models.done ] && pgrep -f "make_qwen3[.]py" > /dev/null; do sleep 2; done
  tail -3 /tmp/models.log; du -sh /tmp/qwen3-8b /tmp/qwen3-14b; df -h /tmp | tail -1
  echo "split3 + models took $(( $(date +%s) - t0 )) s"
  shift
  start_jobs "$@"
  ;;
quick2)  # split2 without the models (a short lease: the 1.1B test model is built by the JOB); or with
  # SIZE=DIR arguments (8b=/tmp/proof8b/hf/qwen3-8b), each built in the background in turn: `wait-models` waits
  (cd /tmp/site && xz -dc "$OLDPWD/.vl1/py.tar.xz" | tar -xf -)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .vl2/whl/*.whl 2>&1 | grep -v WARNING
  rm -rf /tmp/tree && mkdir -p /tmp/tree && xz -dc .dev/tree.tar.xz | tar -C /tmp/tree -xf -
  shift
  if [ $# -gt 0 ]; then
    builds=""
    for pair in "$@"; do builds+="python3 /tmp/tree/bench/real_vllm/make_qwen3.py ${pair#*=} ${pair%%=*} && "; done
    setsid bash -c ". $ENVFILE; ${builds}echo built > /tmp/models.done" > /tmp/models.log 2>&1 < /dev/null &
  fi
  ;;
wait-models)  # a JOB: until the background model builds (split2, quick2 SIZE=DIR) have ended
  while [ ! -f /tmp/models.done ] && pgrep -f "make_qwen3[.]py" > /dev/null; do sleep 2; done
  tail -3 /tmp/models.log; [ -f /tmp/models.done ]
  ;;
quick3)  # split3 without waiting for models, then the JOBs
  (cd /tmp/site && xz -dc "$OLDPWD/.vl2/third_party.tar.xz" | tar -xf -)
  xz -T4 -dc .vl2/fa3.xz > /tmp/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so
  . $ENVFILE
  shift
  start_jobs "$@"
  ;;
memlog)  # a JOB line "bash .dev/on_gpu.sh memlog &": every 0.5 s epoch, NVML MiB used, MemAvailable and Mlocked kB
  mkdir -p /tmp/results
  while true; do
    echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" \
      "$(awk '/MemAvailable|Mlocked/{printf "%s ", $2}' /proc/meminfo)"
    sleep 0.5
  done >> /tmp/results/mem.txt
  ;;
proc1)
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/dsite .dev/whl/*.whl
  cat > $ENVFILE <<ENV
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:/tmp/dsite:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export PROOF_RUNTIME=process PROOF_WORK=/tmp/launcher LAUNCHER_RESULTS=/tmp/results/launcher.json
export SWAP_PYTHON=$(command -v python3) SWAP_MACHINE="H200 VM (device kind nvidia-h200)"
ENV
  bash "$here/install-on-gpu.sh" 1
  nvidia-smi --query-gpu=index,uuid,memory.used --format=csv
  echo "proc1 took $(( $(date +%s) - t0 )) s"
  ;;
proc2)
  . $ENVFILE
  t0=$(date +%s)
  bash "$here/install-on-gpu.sh" 2 | tail -2
  echo "vllm2 + model took $(( $(date +%s) - t0 )) s"
  shift
  start_jobs "$@"
  ;;
jobs)
  . $ENVFILE
  watch_jobs
  ;;
vllm2jobs|vllm2early)
  echo "export LAUNCHER_RESULTS=/tmp/results/launcher.json SWAP_PYTHON=$(command -v python3)" >> $ENVFILE
  . $ENVFILE
  if [ "$1" = vllm2jobs ]; then second_half_and_image; else second_half; fi
  shift
  start_jobs "$@"
  ;;
image)
  . $ENVFILE
  image_layer
  ;;
podman)
  t0=$(date +%s)
  eval "$(bash "$here/install-podman.sh")"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/dsite .dev/whl/*.whl
  cat > $ENVFILE <<ENV
export PATH=$PATH XTABLES_LIBDIR=$XTABLES_LIBDIR
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:/tmp/dsite:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export PROOF_RUNTIME=podman PROOF_WORK=$WORK
ENV
  . $ENVFILE
  mkdir -p /run/podman
  setsid podman system service --time=0 unix:///run/podman/podman.sock > /tmp/podman-service.log 2>&1 < /dev/null &
  setsid bash "$here/build_image.sh" base > /tmp/base-image.log 2>&1 < /dev/null &
  podman version 2>&1 | head -3
  nvidia-smi --query-gpu=index,uuid,memory.used --format=csv
  cat /etc/cdi/nvidia.yaml | head -12
  echo "podman step took $(( $(date +%s) - t0 )) s"
  ;;
vllm1)
  . $ENVFILE
  t0=$(date +%s)
  bash "$here/install-on-gpu.sh" 1
  echo "vllm1 took $(( $(date +%s) - t0 )) s; base import: $(cat /tmp/base-image.log)"
  ;;
vllm2)
  . $ENVFILE
  second_half_and_image
  podman images
  setsid python3 "$here/proof.py" "${2:-dankserve_cold}" > /tmp/proof-run.log 2>&1 < /dev/null &
  watch_proof
  ;;
watch)
  . $ENVFILE
  if [ -n "${2:-}" ] && ! pgrep -f proof.py >/dev/null; then
    setsid python3 "$here/proof.py" "$2" >> /tmp/proof-run.log 2>&1 < /dev/null &
  fi
  watch_proof
  ;;
sh)
  . $ENVFILE
  shift; eval "$*"
  ;;
*) echo "usage: on_gpu.sh podman|vllm1|vllm2 STEPS|vllm2jobs JOB...|vllm2early JOB...|image|watch [STEPS]|proc1|proc2 JOB...|jobs|sh CMD" >&2; exit 2 ;;
esac
