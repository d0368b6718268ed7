#!/bin/bash
# Run BG: scripts/gpu-tests.sh whole (the CUDA backend tests and measurements, the
# memcast_torch library tests, the Python tests, the device replays) at commit 6e1a162,
# where spill hysteresis (`TierConfig::spill_hysteresis`) was on by default (off again
# since: docs/tiers.md, "Spill hysteresis"), on the machine
# run BF had just used. Ran on an H100 80GB HBM3 at commit 6e1a162 in 350 s: every part
# passed (18 CUDA backend tests, 3 measurements, 8 memcast_torch library tests, 52
# Python tests, the device replays); runBG-gpu-tests.log, runBG-cuda-figures.jsonl.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; logs in $OUT.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
timeout 560 "$here/gpu-tests.sh" $OUT/gpu > $OUT/gpu-tests.log 2>&1
echo "gpu-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "^== |test result|passed|failed|FAILED|panicked" $OUT/gpu-tests.log | head -40
