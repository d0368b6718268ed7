#!/bin/bash
# Run AK: runAJ.sh again after the need a forecast gives stopped at the level envelope
# (`Forecast::level_envelope`): runAI.sh's first phase again after forecasts made on steps with lost events
# stopped driving anything (`Engine::mark_gap`): the corpus workloads of dynamic shapes
# under memcast reactive and `predictive:true`, six processes at a time on the one GPU,
# with predictive mode's log at debug (MEMCAST_LOG) and the forecast thread's counters
# in each figure (`forecast_service`); then `gpt2_dynseq_b8_bf16`, whose predictive run
# overshot in runs AI and AJ, four more times in predictive mode, four processes at a time.
# Staged with scripts/stage-gpu.sh .gpu; run from the repository root; figures in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so PYTHONPATH=$PWD/.gpu/python MEMCAST_REQUIRE_GPU=1
export MEMCAST_LOG=memcast_alloc::predictive=debug
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
mkdir -p $OUT/w $OUT/again/w
names=$(awk -F'\t' '$4=="dynamic" {print $2}' training-data/corpus/manifest.tsv | grep -v -e '^bert_dynseq_b16_train$' -e '^gpt2_dynbatch_s512_train_bf16$' -e '^gpt2_generate_dynamic$' -e '^resnet50_multiscale_b32_train$')
run() {  # workload tag conf; no new run after $limit s
  if [ $(( $(date +%s) - start )) -gt ${limit:-480} ]; then echo "$1 $2 skipped (time)"; return; fi
  MEMCAST_ALLOC_CONF=$3 timeout ${tmo:-150} python3 scripts/corpus/record.py --workload $1 --mode memcast \
    --tag $2 --out $OUT/w > $OUT/w/$1.$2.log 2>&1; echo "$1 $2 exit $?"
}
limit=170; export -f run; export OUT start limit
for w in $names; do echo "$w reactive"; echo "$w predictive predictive:true"; done \
  | xargs -P 6 -L 1 bash -c 'run $0 $1 ${2:-}' 2>&1 | grep -v "exit 0" || true
cat $OUT/w/*.json > $OUT/predictive-gpu.jsonl 2>/dev/null
echo "$(wc -l < $OUT/predictive-gpu.jsonl) figures"
echo "== gpt2_dynseq_b8_bf16 again"
limit=${AJ_LIMIT:-420}
for k in a b c d; do echo "gpt2_dynseq_b8_bf16 predictive-$k predictive:true"; done \
  | OUT=$OUT/again xargs -P 4 -L 1 bash -c 'run $0 $1 ${2:-}' 2>&1 || true
cat $OUT/again/w/*.json > $OUT/again.jsonl 2>/dev/null
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["allocator"], "overhead %.2f%%" % (100 * r["reserved_overhead"]), "service", r.get("forecast_service"))
' $OUT/again.jsonl
grep -h "raised to the forecast peak" $OUT/w/gpt2_dynseq_b8_bf16.predictive.log $OUT/again/w/*.log | head -20
echo "total $(( $(date +%s) - start )) s"
