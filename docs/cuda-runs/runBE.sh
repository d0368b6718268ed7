#!/bin/bash
# Run BE: scripts/gpu-tests.sh whole (the CUDA backend tests and measurements, the
# memcast_torch library tests, the Python tests, the device replays) at the code of this
# round of careless-input fixes: the allocator refuses a segment granule larger than
# the device at setup (every allocator made on the GPU passes through it), the
# out-of-memory path lands stuck copies, trace and settings files are read bounded.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; logs in $OUT. Ran on an H100 80GB HBM3 (the device given) at commit
# 153e1b6 in 316 s: every part passed (18 CUDA backend tests, 3 measurements, 8
# memcast_torch library tests, 52 Python tests, the device replays);
# runBE-gpu-tests.log, runBE-cuda-figures.jsonl.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
timeout 560 "$here/gpu-tests.sh" $OUT/gpu > $OUT/gpu-tests.log 2>&1
echo "gpu-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "^== |test result|passed|failed|FAILED|panicked" $OUT/gpu-tests.log | head -40
