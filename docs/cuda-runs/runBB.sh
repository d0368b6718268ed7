#!/bin/bash
# Run BB: the CUDA backend tests at the code that counts accesses of tensors prefetched
# from pageable memory as misses and the spills the pinned pool turns away; then the
# validation split tiered at 60% with a pinned pool of a quarter of each trace's peak
# (`--pinned 25%`), reactive against predictive, with spills that nothing waits for kept
# to the pinned pool (the default) and with them allowed into pageable memory
# (`--early-pageable`): the rule was chosen on this split in the sim; this checks it on
# the device. scripts/tier_replays_gpu.sh, two rounds where time allows.
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
grep -E "test result|panicked|FAILED" $OUT/cuda-tests.log | head -20
m=$root/training-data/corpus/manifest.tsv
MEMCAST_REPLAY_ARGS="--pinned 25%" "$here/tier_replays_gpu.sh" $OUT/on $m validation 0.6 100
MEMCAST_REPLAY_ARGS="--pinned 25% --early-pageable" "$here/tier_replays_gpu.sh" $OUT/off $m validation 0.6 100
echo "total $(( $(date +%s) - start )) s"
# The rule-off pass ran out of time before fcn_r50_multiscale_b8; a second call on the
# same machine ran it with both settings (its lines are at the end of runBB-on.jsonl and
# runBB-off.jsonl):
#   m=training-data/corpus/manifest.tsv; r=training-data/corpus/runBB2.tsv; head -1 $m > $r
#   grep -P '^validation/fcn_r50_multiscale_b8.mctrace\t' $m >> $r
#   MEMCAST_REPLAY_ARGS="--pinned 25% --early-pageable" .gpu/tier_replays_gpu.sh $OUT/off $r validation 0.6 30
#   MEMCAST_REPLAY_ARGS="--pinned 25%" .gpu/tier_replays_gpu.sh $OUT/on $r validation 0.6 30
