#!/bin/bash
# Run AI, on an H100 80GB HBM3 (run as `AH_LIMIT=420 bash docs/cuda-runs/runAI.sh`: the
# alone phase stopped at 420 s, after the first round and three workloads of the second).
# runAG.sh again at the final code of the hand-over: every 16 events, every 256 while the
# forecast thread is behind (the back-off). The corpus workloads of dynamic shapes under
# memcast reactive and `predictive:true`, six processes at a time on the one GPU; then
# `memcast replay --real-time` of a bundled dynamic trace on this machine's host; then six
# of them alone on the GPU, one process at a time, reactive and predictive in turn (two
# rounds, the second in the other order), for iteration times and the time spent in
# device calls that compare.
# Staged with scripts/stage-gpu.sh .gpu; run from the repository root; figures in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so PYTHONPATH=$PWD/.gpu/python MEMCAST_REQUIRE_GPU=1
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
mkdir -p $OUT/w
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
echo "== real-time replay"
.gpu/memcast replay .gpu/traces/gpt2_dynbatch_s512_train_bf16.mctrace --real-time --compare memcast,predictive --json > $OUT/replay-real-time.json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: v["critical_path_device_calls_after_first_iteration"] for k, v in d.items()})' $OUT/replay-real-time.json
echo "== alone"
mkdir -p $OUT/alone/w; limit=${AH_LIMIT:-520} tmo=60  # AH_LIMIT: no new run after it (s)
alone="bert_large_dynbatch_s128_sgd t5_small_dynseq_b32 convnext_tiny_multiscale_b32 unet_dynres_b32_bf16 swin_v2_t_multiscale_b32 llama_dynbatch_s512_2stream"
for w in $alone; do
  OUT=$OUT/alone run $w reactive-1 ""; OUT=$OUT/alone run $w predictive-1 predictive:true
done
for w in $alone; do
  OUT=$OUT/alone run $w predictive-2 predictive:true; OUT=$OUT/alone run $w reactive-2 ""
done
cat $OUT/alone/w/*.json > $OUT/predictive-gpu-alone.jsonl 2>/dev/null
echo "$(wc -l < $OUT/predictive-gpu-alone.jsonl) figures alone"
echo "total $(( $(date +%s) - start )) s"
