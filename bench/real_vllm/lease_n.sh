# Run N of issue 28 and the H200 upgrade of issue 30 (2026-12-03, session 11): one Podman lease, run as one JOB
# from /tmp/tree by `on_gpu.sh quick3 "bash bench/real_vllm/lease_n.sh"` (after `on_gpu.sh podman`, the kernels
# call and `on_gpu.sh quick2 8b=/tmp/proof8b/hf/qwen3-8b`), then `on_gpu.sh jobs` until it ends. Results land in
# /tmp/results and /tmp/out-extra (bundled). An optional /tmp/more-jobs.sh replaces the part after the 8B launcher run.
set -x
export OUT=
export SWAP_PYTHON=$(command -v python3) SWAP_MACHINE="H200 VM (device kind nvidia-h200)"
X=/tmp/out-extra
mkdir -p $X /tmp/results
cd /tmp/tree
keep() { cp /tmp/results/* $X/ 2>/dev/null; podman ps -a --format '{{.Names}} {{.Status}}' > $X/podman-ps-after-$1.txt 2>&1; }
[ -f /tmp/tinyllama/config.json ] || python3 bench/real_vllm/make_tiny_llama.py /tmp/tinyllama > $X/tiny.txt 2>&1
(bash bench/real_vllm/on_gpu.sh image > $X/image.txt 2>&1; echo "image rc $?" >> $X/image.txt) &
img=$!
bash bench/real_vllm/on_gpu.sh wait-models > $X/models.txt 2>&1
python3 bench/real_vllm/loadbench.py /tmp/proof8b/hf/qwen3-8b --repeat 3 --out /tmp/results/loadbench-8b.json > $X/loadbench.txt 2>&1
wait $img
python3 bench/real_vllm/upgrade.py --out /tmp/results --rooms sleep > $X/upgrade.txt 2>&1
cp /tmp/upgrade/*.log $X/ 2>/dev/null; keep upgrade
PROOF_WORK=/tmp/proof8b PROOF_MODEL=/tmp/proof8b/hf/qwen3-8b LAUNCHER_MODEL_NAME=qwen3-8b \
  LAUNCHER_RESULTS=/tmp/results/launcher-8b-podman.json python3 bench/real_vllm/launcher.py \
  cold,launcher-kill,launcher-down-up,manual-best,summary --requests --repeat 2 --manual-repeat 2 > $X/launcher-8b-podman.txt 2>&1
for f in /tmp/proof8b/*.log /tmp/proof8b/*.json; do [ -f "$f" ] && cp "$f" "$X/p8-$(basename "$f")"; done
keep launcher
if [ -f /tmp/more-jobs.sh ]; then bash /tmp/more-jobs.sh; exit; fi
podman rm -af > /dev/null 2>&1; podman rmi -af > /dev/null 2>&1; df -h /tmp | tail -1 > $X/df.txt
python3 bench/real_vllm/make_qwen3.py /tmp/qwen3-14b 14b > $X/build14.txt 2>&1
SWAP_MODEL_A=/tmp/qwen3-14b SWAP_MODEL_B=/tmp/proof8b/hf/qwen3-8b python3 bench/real_vllm/swap.py \
  --out /tmp/results/stop --modes stoplauncher --swaps 2 > $X/swap-stop.txt 2>&1
keep stop
SWAP_MODEL_A=/tmp/qwen3-14b SWAP_MODEL_B=/tmp/proof8b/hf/qwen3-8b python3 bench/real_vllm/swap.py \
  --out /tmp/results/fst --modes level2fst --swaps 10 > $X/swap-fst.txt 2>&1
keep fst
