#!/bin/bash
# Run AM: run AK's measurement again after the setup (what comes before a job's first
# iteration boundary: the model built, a warm-up) stopped counting as a rise seen and
# bounds the level only until the first iteration after it passes the setup's peak:
# the corpus workloads of dynamic shapes under memcast reactive and `predictive:true`,
# six processes at a time on the one GPU (predictive mode's log at debug); then
# `gpt2_dynseq_b8_bf16`, whose predictive run overshot in runs AI and AJ, four more
# times, one of them recording what memcast saw from the start (`--memcast-trace`).
# Staged with scripts/stage-gpu.sh .gpu; run from the repository root; figures in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so PYTHONPATH=$PWD/.gpu/python MEMCAST_REQUIRE_GPU=1
export MEMCAST_LOG=memcast_alloc::predictive=debug
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
mkdir -p /tmp/w /tmp/again/w
names=$(awk -F'\t' '$4=="dynamic" {print $2}' training-data/corpus/manifest.tsv | grep -v -e '^bert_dynseq_b16_train$' -e '^gpt2_dynbatch_s512_train_bf16$' -e '^gpt2_generate_dynamic$' -e '^resnet50_multiscale_b32_train$')
run() {  # workload tag conf [extra record.py args]; no new run after $limit s
  if [ $(( $(date +%s) - start )) -gt ${limit:-480} ]; then echo "$1 $2 skipped (time)"; return; fi
  MEMCAST_ALLOC_CONF=$3 timeout ${tmo:-150} python3 scripts/corpus/record.py --workload $1 --mode memcast \
    --tag $2 --out $W/w ${4:-} > $W/w/$1.$2.log 2>&1; echo "$1 $2 exit $?"
}
limit=170; export -f run; export start limit
for w in $names; do echo "$w reactive"; echo "$w predictive predictive:true"; done \
  | W=/tmp xargs -P 6 -L 1 bash -c 'run $0 $1 ${2:-}' 2>&1 | grep -v "exit 0" || true
cat /tmp/w/*.json > $OUT/AM-predictive-gpu.jsonl 2>/dev/null
echo "$(wc -l < $OUT/AM-predictive-gpu.jsonl) figures"
echo "== gpt2_dynseq_b8_bf16 again"
limit=${AM_LIMIT:-420}
(echo "gpt2_dynseq_b8_bf16 predictive-a predictive:true --memcast-trace=/tmp/again/gpt2_dynseq_job_a.mctrace"
 for k in b c d; do echo "gpt2_dynseq_b8_bf16 predictive-$k predictive:true"; done) \
  | W=/tmp/again xargs -P 4 -L 1 bash -c 'run $0 $1 $2 ${3:-}' 2>&1 || true
cat /tmp/again/w/*.json > $OUT/AM-gpt2-dynseq-again.jsonl 2>/dev/null
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["allocator"], "overhead %.2f%%" % (100 * r["reserved_overhead"]), "service", r.get("forecast_service"))
' $OUT/AM-gpt2-dynseq-again.jsonl
grep -h "raised to the forecast peak" /tmp/w/gpt2_dynseq_b8_bf16.predictive.log /tmp/again/w/*.log | head -20
cat /tmp/w/*.log /tmp/again/w/*.log | grep -h "DEBUG" | gzip > $OUT/AM-debug.log.gz
cp /tmp/again/gpt2_dynseq_job_a.mctrace $OUT/ 2>/dev/null
echo "total $(( $(date +%s) - start )) s"
