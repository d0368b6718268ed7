#!/bin/bash
# `lb SPLIT`: records that split's workloads one at a time with launch blocking (as
# runAA.sh lb does the test split) into $OUT/lb-SPLIT.tar.gz; `--only a,b` records
# those alone. `lbtimes`: times the train split's iterations with CUDA_LAUNCH_BLOCKING=1
# (scripts/corpus/time_iterations.py) into $OUT/lb-times-train.jsonl. Run from the
# repository root with a staged folder .gpu (scripts/stage-gpu.sh .gpu):
#   bash docs/cuda-runs/runAC.sh lb SPLIT [--only a,b] | lbtimes
set -u
mode=$1; shift
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
start=$(date +%s)
if [ "$mode" = lb ]; then
split=$1; shift
d=/tmp/lb-$split
python3 scripts/corpus/record_all.py --out $d --jobs 1 --split $split --modes native \
    --launch-blocking --deadline-s 480 --memcast .gpu/memcast "$@" 2>&1 | tail -30
tar czf $OUT/lb-$split.tar.gz -C $d traces manifest.tsv pytorch_allocator_figures.jsonl logs
else
names=$(awk -F'\t' 'NR>1 && $5=="train"{print $2}' training-data/corpus/manifest.tsv | paste -sd, )
names=$(python3 -c 'import sys; sys.path.insert(0, "scripts/corpus"); import workloads as W; print(",".join(n for n in sys.argv[1].split(",") if n in W.RECIPES))' "$names")
CUDA_LAUNCH_BLOCKING=1 python3 scripts/corpus/time_iterations.py --only "$names" \
    --deadline-s 480 > $OUT/lb-times-train.jsonl
wc -l $OUT/lb-times-train.jsonl
fi
echo "total $(( $(date +%s) - start )) s"
