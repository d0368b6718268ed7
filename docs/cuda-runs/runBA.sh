#!/bin/bash
# Run BA: the CUDA backend tests, then the whole held-out split tiered at 60%, reactive
# against predictive, at the code where spills that nothing waits for go only to the
# pinned pool (`TierConfig::early_spills_pinned`; run AZ is the same at the code before),
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
# The one round ran out of time before the last three traces; a second call on the same
# machine ran them (their lines are at the end of runBA-split.jsonl):
#   m=training-data/corpus/manifest.tsv; r=training-data/corpus/runBA2.tsv; head -1 $m > $r
#   grep -P '^test/(conformer_b16_1024f_bf16|fasterrcnn_mnv3_b8|retinanet_r50_b4).mctrace\t' $m >> $r
#   .gpu/tier_replays_gpu.sh $OUT/rest $r test 0.6 60
