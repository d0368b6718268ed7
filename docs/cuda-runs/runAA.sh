#!/bin/bash
# Records the test split's workloads one at a time (no other job on the GPU), native
# allocator with memory history, in one of two ways: `lb` with CUDA_LAUNCH_BLOCKING=1
# (event times follow the GPU's work), `solo` without. Imports them with memcast and
# packs traces, figures and manifest into $OUT/$1.tar.gz. Run from the repository root
# with a staged folder .gpu (scripts/stage-gpu.sh .gpu):  bash docs/cuda-runs/runAA.sh lb|solo [--only a,b]
set -u
mode=$1; shift
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
start=$(date +%s)
d=/tmp/$mode
flag=""; [ "$mode" = lb ] && flag="--launch-blocking"
python3 scripts/corpus/record_all.py --out $d --jobs 1 --split test --modes native $flag \
    --deadline-s 500 --memcast .gpu/memcast "$@" 2>&1 | tail -40
tar czf $OUT/$mode.tar.gz -C $d traces manifest.tsv pytorch_allocator_figures.jsonl logs
ls -la $OUT
echo "total $(( $(date +%s) - start )) s"
