#!/usr/bin/env bash
# Carries real vLLM 0.26.0 and CRIU onto the device in three calls (64 MiB each): stage.sh 1|2|3.
# Call 3 installs into /tmp/site (as ../real-vllm/install-on-gpu.sh does) and unpacks CRIU into /tmp/criu.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p /tmp/stage
cp "$root/.dev/b$1"/* /tmp/stage/
if [ "$1" = 1 ]; then mkdir -p /tmp/criu && tar -C /tmp -xJf /tmp/stage/criu.txz; fi
if [ "$1" = 3 ]; then
  mkdir -p /tmp/site && (cd /tmp/site && xz -dc /tmp/stage/py.tar.xz | tar -xf - && xz -dc /tmp/stage/third_party.tar.xz | tar -xf -)
  cat /tmp/stage/Cpart.aa /tmp/stage/Cpart.ab | xz -dc > /tmp/site/vllm/_C_stable_libtorch.abi3.so
  xz -dc /tmp/stage/fa3.xz > /tmp/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/stage/*.whl 2>&1 | grep -v WARNING || true
  PYTHONPATH=/tmp/site python3 -c 'import vllm; print("vllm", vllm.__version__)'
fi
echo "stage $1 done"
