#!/bin/bash
# Records every corpus workload with memory history on from the process's start
# (scripts/corpus/record_all.py --from-start: the traces hold the model's
# construction and the warm-up iteration, and have no static blocks), beside an
# expandable-segments run of each, imports them with memcast, and packs the traces,
# figures and manifest into $OUT/from-start.tar.gz. Run from the repository root with
# a staged folder .gpu (scripts/stage-gpu.sh .gpu).
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'
start=$(date +%s)
d=/tmp/from-start
python3 scripts/corpus/record_all.py --out $d --jobs 6 --from-start --deadline-s 420 \
    --memcast .gpu/memcast 2>&1 | tail -25
for f in $d/traces/*.mctrace; do
  printf '%s ' "$(basename $f)"; .gpu/memcast trace stats $f 2>&1 | grep -iE "static|iterations" | tr '\n' ' '; echo
done | head -70
tar czf $OUT/from-start.tar.gz -C $d traces manifest.tsv pytorch_allocator_figures.jsonl logs
ls -la $OUT
echo "total $(( $(date +%s) - start )) s"
