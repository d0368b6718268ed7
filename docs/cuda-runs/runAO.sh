#!/bin/bash
# Run AO: run AM's first phase on the test workloads of dynamic shapes at the code of
# run AN (the setup's step not scored), which run AN left out for want of device time:
# memcast reactive and `predictive:true`, seven processes at a time; then the Rust CUDA
# backend tests if time is left. Staged with scripts/stage-gpu.sh .gpu; figures in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so PYTHONPATH=$PWD/.gpu/python MEMCAST_REQUIRE_GPU=1
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/w
names=$(awk -F'\t' '$4=="dynamic" && $5=="test" {print $2}' training-data/corpus/manifest.tsv)
run() {  # workload tag conf; no new run after 330 s
  if [ $(( $(date +%s) - start )) -gt 330 ]; then echo "$1 $2 skipped (time)"; return; fi
  MEMCAST_ALLOC_CONF=$3 timeout 150 python3 scripts/corpus/record.py --workload $1 --mode memcast \
    --tag $2 --out /tmp/w > /tmp/w/$1.$2.log 2>&1; echo "$1 $2 exit $? at $(( $(date +%s) - start )) s"
}
export -f run; export start
for w in $names; do echo "$w reactive"; echo "$w predictive predictive:true"; done \
  | xargs -P 7 -L 1 bash -c 'run $0 $1 ${2:-}' 2>&1 | grep -v "exit 0" || true
cat /tmp/w/*.json > $OUT/runAO-predictive-gpu.jsonl 2>/dev/null
echo "$(wc -l < $OUT/runAO-predictive-gpu.jsonl) figures at $(( $(date +%s) - start )) s"
if [ $(( $(date +%s) - start )) -lt 400 ]; then
  timeout $(( 585 - ($(date +%s) - start) )) .gpu/cuda-tests --include-ignored --test-threads=1 \
    > $OUT/runAO-cuda-tests.log 2>&1; echo "cuda tests exit $?"; tail -3 $OUT/runAO-cuda-tests.log
fi
echo "total $(( $(date +%s) - start )) s"
