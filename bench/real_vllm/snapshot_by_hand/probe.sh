#!/usr/bin/env bash
# Issue 44 item 1 on the device: what the machine is, criu check, the CUDA checkpoint round trip.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export LD_LIBRARY_PATH=/tmp/criu/lib
CRIU=/tmp/criu/criu
chmod +x "$CRIU"
{
echo "== uname"; uname -a
echo "== os"; grep PRETTY /etc/os-release
echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
echo "== python"; python3 -c 'import sys, torch; print(sys.version); print(torch.__version__)'
python3 -c 'import importlib.metadata as m; print("cuda-bindings", m.version("cuda-bindings"))'
python3 -c 'from cuda.bindings import driver as d; print("bindings has cuCheckpointProcessLock:", hasattr(d, "cuCheckpointProcessLock"))'
echo "== io_uring_disabled"; cat /proc/sys/kernel/io_uring_disabled 2>&1
echo "== caps"; grep Cap /proc/self/status
echo "== criu --version"; "$CRIU" --version
echo "== criu check"; "$CRIU" check; echo "rc $?"
echo "== criu check --all"; "$CRIU" check --all 2>&1 | tail -15; echo "rc $?"
echo "== podman"; command -v podman || echo "no podman"
echo "== disk"; df -h /tmp | tail -1; free -g | head -2
} 2>&1 | tee "$OUT/facts.txt"
echo "== roundtrip"
CRIU=/tmp/criu/criu
cp /tmp/probe/img/dump.log /tmp/probe/img/restore.log /tmp/probe/child.log "$OUT/" 2>/dev/null
true
