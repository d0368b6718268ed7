#!/bin/bash
# Run AX: the CUDA backend tests at the code whose device stall counts the host's time
# inside copies to or from pageable memory (the driver blocks the host in them), then
# the two held-out traces whose replays spill to pageable memory (GraphSAGE and the
# LoRA Llama, where run AW's faults moved bytes faster than the link can), tiered at
# 60%, reactive against predictive, twice, with scripts/tier_replays_gpu.sh.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; figures in $OUT.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
start=$(date +%s)
timeout 240 "$here/cuda-tests" --include-ignored --test-threads=1 > $OUT/cuda-tests.log 2>&1
echo "cuda-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "test result|panicked|FAILED" $OUT/cuda-tests.log | head -20
m=$root/training-data/corpus/manifest.tsv
two=$root/training-data/corpus/runAX.tsv
head -1 $m > $two
grep -P '^test/(sage_dyngraph|llama_lora_b8_s1024_bf16).mctrace\t' $m >> $two
"$here/tier_replays_gpu.sh" $OUT/pageable $two test 0.6 60
