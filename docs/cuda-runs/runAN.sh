#!/bin/bash
# Run AN: the first phase of run AM (runAM.sh) again after the forecast made at the
# setup's step stopped being scored for trust, on the train and validation workloads of
# dynamic shapes only (the session's device time was short): memcast reactive and
# `predictive:true`, seven processes at a time, then `gpt2_dynseq_b8_bf16` three more
# times in predictive mode. Staged with scripts/stage-gpu.sh .gpu; figures in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so PYTHONPATH=$PWD/.gpu/python MEMCAST_REQUIRE_GPU=1
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/w
names=$(awk -F'\t' '$4=="dynamic" && ($5=="train" || $5=="validation") {print $2}' training-data/corpus/manifest.tsv \
  | grep -v -e '^bert_dynseq_b16_train$' -e '^gpt2_dynbatch_s512_train_bf16$' -e '^gpt2_generate_dynamic$' -e '^resnet50_multiscale_b32_train$')
run() {  # workload tag conf
  MEMCAST_ALLOC_CONF=$3 timeout 100 python3 scripts/corpus/record.py --workload $1 --mode memcast \
    --tag $2 --out /tmp/w > /tmp/w/$1.$2.log 2>&1; echo "$1 $2 exit $? at $(( $(date +%s) - start )) s"
}
export -f run; export start
(for w in $names; do echo "$w reactive"; echo "$w predictive predictive:true"; done
 for k in b c d; do echo "gpt2_dynseq_b8_bf16 predictive-$k predictive:true"; done) \
  | xargs -P 7 -L 1 bash -c 'run $0 $1 ${2:-}' 2>&1 | grep -v "exit 0" || true
cat /tmp/w/*.json > $OUT/AN-predictive-gpu.jsonl 2>/dev/null
echo "$(wc -l < $OUT/AN-predictive-gpu.jsonl) figures; total $(( $(date +%s) - start )) s"
