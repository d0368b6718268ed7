#!/bin/bash
# Run BF: the CUDA backend tests at commit 6e1a162, where spill hysteresis
# (`TierConfig::spill_hysteresis`) was on by default (off again since: docs/tiers.md,
# "Spill hysteresis"), then the whole held-out split tiered at 60%, reactive
# against predictive, with scripts/tier_replays_gpu.sh, every replay's JSON in one file.
# Ran on an H100 80GB HBM3 (the device given) at commit 6e1a162 in 489 s:
# runBF-cuda-tests.log (18 of 18), runBF-cuda-report.jsonl, runBF-split.jsonl (every
# test trace once, seven a second time, 383 s).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; figures in $OUT.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 150 "$here/cuda-tests" --include-ignored --test-threads=1 > $OUT/cuda-tests.log 2>&1
echo "cuda-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "test result|panicked|FAILED" $OUT/cuda-tests.log | head -20
"$here/tier_replays_gpu.sh" $OUT/split $root/training-data/corpus/manifest.tsv test 0.6 ${SPLIT_LIMIT:-380}
echo "total $(( $(date +%s) - start )) s"
