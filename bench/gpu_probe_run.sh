#!/usr/bin/env bash
# Check the probe on a real GPU machine: what the driver and the OS say, what `dankserve probe`
# says, the gpu-marked tests, and the probe timings. Writes everything under $OUT (or
# bench/results/gpu-probe/) and prints a summary. Installs nothing: dankserve's dependencies
# must already be importable (e.g. through PYTHONPATH). Exit status: 1 if any step failed.
set -u

REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO" || exit 1
DEST="${OUT:-$REPO/bench/results/gpu-probe}"
mkdir -p "$DEST"
PY="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# the probe and its tests must not pick up a recorded host or a config from the environment
unset DANKSERVE_HARDWARE DANKSERVE_CONFIG
failed=0

# step NAME CMD...: run CMD, output to $DEST/NAME, echo it, record the exit status
step() {
    local name="$1"
    shift
    echo "===== $name: $*"
    "$@" >"$DEST/$name" 2>&1
    local rc=$?
    cat "$DEST/$name"
    echo "===== $name: exit $rc"
    echo "$name $rc" >>"$DEST/exit-codes.txt"
    [ "$rc" -eq 0 ] || failed=1
}

: >"$DEST/exit-codes.txt"
step python-version.txt "$PY" -c 'import sys, pynvml, psutil, pydantic, click; print(sys.version)'
step nvidia-smi-q.txt nvidia-smi -q
step nvidia-smi-topo.txt nvidia-smi topo -m
step nvidia-smi-query.csv nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.free,pci.bus_id,compute_cap \
    --format=csv,noheader,nounits
step lscpu.txt lscpu
step sysfs-numa.txt sh -c 'for n in /sys/devices/system/node/node*; do
    echo "$n cpulist=$(cat "$n/cpulist")"; grep MemTotal "$n/meminfo"; done
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
        echo "$d class=$(cat "$d/class") numa_node=$(cat "$d/numa_node") local_cpulist=$(cat "$d/local_cpulist")"
    done'
step probe.json "$PY" -m dankserve probe --json --save "$DEST/recorded-host.json"
step probe.txt "$PY" -m dankserve probe
step pytest-gpu.txt "$PY" -m pytest -p no:cacheprovider -v -rs \
    tests/host/test_nvml.py tests/host/test_probe.py tests/cli/test_probe.py
step probe-timing.txt "$PY" bench/probe_timing.py
cp bench/results/probe_timing.json "$DEST/probe_timing.json" 2>/dev/null || true

echo "===== summary (exit status per step)"
cat "$DEST/exit-codes.txt"
echo "results in $DEST"
exit "$failed"
