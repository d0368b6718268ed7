#!/bin/bash
# Predictive mode in real jobs on the GPU, no budget: every workload of the corpus
# (scripts/corpus/record.py --mode memcast, 8 recorded iterations, 12 for dynamic ones)
# with memcast reactive (the defaults) and with `predictive:true` (the built-in LSTM on
# its own thread, the default actions), six processes at a time on the one GPU; per
# iteration the device calls made inside requests and ahead of need, the time in
# memcast's malloc, the wall time. First, the GPU's name and the cost model it picks
# (the CUDA test and `memcast replay --device cuda` without --costs). Staged with
# scripts/stage-gpu.sh .gpu; run from the repository root; figures in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so PYTHONPATH=$PWD/.gpu/python MEMCAST_REQUIRE_GPU=1
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
echo "== the GPU's name and its cost model"
.gpu/cuda-tests --test-threads=1 --nocapture the_gpu_is_named 2>&1 | grep -E "GPU 0|cost model|test result|panicked"
for c in "" "--costs h200"; do
  .gpu/memcast replay .gpu/traces/resnet50_b64_train.mctrace --device cuda --json $c \
    | python3 -c 'import json,sys; print("costs:", json.load(sys.stdin).get("costs"))'
done
.gpu/memcast replay .gpu/traces/resnet50_b64_train.mctrace --device cuda | tail -2
echo "== workloads"
mkdir -p $OUT/w
names=$(python3 -c 'import re; print(" ".join(re.findall(r"^add\(\"([^\"]+)\"", open("scripts/corpus/workloads.py").read(), re.M)))')
run() {  # workload tag conf; no new run after 500 s
  if [ $(( $(date +%s) - start )) -gt 500 ]; then echo "$1 $2 skipped (time)"; return; fi
  MEMCAST_ALLOC_CONF=$3 timeout 150 python3 scripts/corpus/record.py --workload $1 --mode memcast \
    --tag $2 --out $OUT/w > $OUT/w/$1.$2.log 2>&1; echo "$1 $2 exit $?"
}
export -f run; export OUT start
for w in $names; do echo "$w reactive"; echo "$w predictive predictive:true"; done \
  | xargs -P 6 -L 1 bash -c 'run $0 $1 ${2:-}' 2>&1 | grep -v "exit 0" || true
cat $OUT/w/*.json > $OUT/predictive-gpu.jsonl 2>/dev/null
echo "$(wc -l < $OUT/predictive-gpu.jsonl) figures; total $(( $(date +%s) - start )) s"
