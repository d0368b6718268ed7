#!/bin/bash
# Run BF: the CUDA backend tests at the code with the cost model's faster interpolation
# and `TierConfig::spill_hysteresis` (off by default), then every test trace replayed
# through the CUDA backend at 60%, reactive against predictive, with
# scripts/tier_replays_gpu.sh (one round; every replay's JSON in one file), the traces
# run BC put far from the sim first (in the manifest's order among themselves).
# Meant for an H200 (the whole split had run on H100s only); three calls for one found
# none, so it ran on an H100 80GB HBM3 (the kind nvidia-h100-x1).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; figures in $OUT.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 170 "$here/cuda-tests" --include-ignored --test-threads=1 > $OUT/cuda-tests.log 2>&1
echo "cuda-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "test result|panicked|FAILED" $OUT/cuda-tests.log | head -20
m=$root/training-data/corpus/manifest.tsv; r=$root/training-data/corpus/runBF.tsv
first='^test/(sage_dyngraph|gcn_fixed_200k|llama_lora_b8_s1024_bf16|vit_b16_b128_ckpt_bf16|llama_b16_s1024_ckpt_bf16)\.mctrace\t'
{ head -1 $m; grep -P "$first" $m; tail -n +2 $m | grep -vP "$first"; } > $r
"$here/tier_replays_gpu.sh" $OUT/split $r test 0.6 $(( 450 - ($(date +%s) - start) ))
echo "total $(( $(date +%s) - start )) s"
