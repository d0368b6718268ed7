#!/bin/bash
# Run BC: the CUDA backend tests at the code that copies a spill in two ranges of the
# pinned pool where no single range holds it (`StagingPool::alloc(bytes, split)`,
# `HostLoc::Warm { head, tail }`) and names a host buffer that cannot be allocated
# (`BackendError::HostOutOfMemory`); then the whole held-out split tiered at 60%,
# reactive against predictive, with scripts/tier_replays_gpu.sh (one round; every
# replay's JSON in one file).
# Ran on an H100 80GB HBM3 (the device given) at commit 71a9320: runBC-cuda-tests.log
# (18 of 18), runBC-cuda-report.jsonl, runBC-split.jsonl (every test trace once, 303 s).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; figures in $OUT.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 180 "$here/cuda-tests" --include-ignored --test-threads=1 > $OUT/cuda-tests.log 2>&1
echo "cuda-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "test result|panicked|FAILED|pageable" $OUT/cuda-tests.log | head -20
# The traces where the sim moved with the split copies (GraphSAGE, GCN) or where run BA
# put predictive above reactive (Llama at batch 8, GCN) first, then the rest in the
# manifest's order, as far as 300 s allow.
m=$root/training-data/corpus/manifest.tsv; r=$root/training-data/corpus/runBC.tsv
first='^test/(sage_dyngraph|gcn_fixed_200k|llama_b8_s1024_bf16_adamw|wav2vec2_dynlen_b8)\.mctrace\t'
{ head -1 $m; grep -P "$first" $m; tail -n +2 $m | grep -vP "$first"; } > $r
"$here/tier_replays_gpu.sh" $OUT/split $r test 0.6 300
echo "total $(( $(date +%s) - start )) s"
