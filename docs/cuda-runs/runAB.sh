#!/bin/bash
# `lb`: records the validation split's workloads one at a time with launch blocking
# (as runAA.sh lb) into $OUT/lb-validation.tar.gz. `solo`: times every corpus
# workload's iterations alone (scripts/corpus/time_iterations.py) into
# $OUT/solo-times.jsonl: on an H200 the test split first (its launch-blocking
# recordings are from an H200), else validation, then test. Run from the
# repository root with a staged folder .gpu (scripts/stage-gpu.sh .gpu):
#   bash docs/cuda-runs/runAB.sh lb|solo
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
start=$(date +%s)
if [ "$1" = lb ]; then
d=/tmp/lb-validation
python3 scripts/corpus/record_all.py --out $d --jobs 1 --split validation --modes native \
    --launch-blocking --deadline-s 170 --memcast .gpu/memcast 2>&1 | tail -12
tar czf $OUT/lb-validation.tar.gz -C $d traces manifest.tsv pytorch_allocator_figures.jsonl logs
else
names() { awk -F'\t' -v s=$1 'NR>1 && $5==s{print $2}' training-data/corpus/manifest.tsv | paste -sd, ; }
case "$gpu" in
  *H200*) order="$(names test),$(names validation),$(names train)" ;;
  *) order="$(names validation),$(names test),$(names train)" ;;
esac
# The bundled traces' names are not recipes of workloads.py: left out.
order=$(python3 -c 'import sys; sys.path.insert(0, "scripts/corpus"); import workloads as W; print(",".join(n for n in sys.argv[1].split(",") if n in W.RECIPES))' "$order")
left=$(( 480 - ($(date +%s) - start) ))
python3 scripts/corpus/time_iterations.py --only "$order" --deadline-s $left > $OUT/solo-times.jsonl
wc -l $OUT/solo-times.jsonl
fi
echo "total $(( $(date +%s) - start )) s"
