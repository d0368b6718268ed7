#!/bin/bash
# Run AZ: the CUDA backend tests (the pageable-copy test now measures both directions),
# then the whole held-out split tiered at 60%, reactive against predictive, at the code
# whose device stall counts the host's time inside copies to or from pageable memory,
# with scripts/tier_replays_gpu.sh (one round; every replay's JSON in one file).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; figures in $OUT.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
start=$(date +%s)
timeout 180 "$here/cuda-tests" --include-ignored --test-threads=1 > $OUT/cuda-tests.log 2>&1
echo "cuda-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "test result|panicked|FAILED|pageable" $OUT/cuda-tests.log | head -20
"$here/tier_replays_gpu.sh" $OUT/split $root/training-data/corpus/manifest.tsv test 0.6 330
# A second call on the same machine ran the split again in reverse order:
#   m=training-data/corpus/manifest.tsv; r=training-data/corpus/runAZ2.tsv
#   head -1 $m > $r; tail -n +2 $m | tac >> $r
#   .gpu/tier_replays_gpu.sh $OUT/split2 $r test 0.6 330
