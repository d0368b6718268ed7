#!/bin/bash
# Run AL: recordings of what memcast sees in real jobs (warm-up included), to choose the
# level envelope's rescale on the jobs themselves: the train and validation workloads of
# dynamic shapes under `predictive:true`, each with `record.py --memcast-trace`, four
# processes at a time; beside them, the GPU suite (scripts/gpu-tests.sh) at this code,
# its driver-cost measurement left out (the recordings share the GPU, so its timings
# would not be clean). Staged with scripts/stage-gpu.sh .gpu; figures in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so PYTHONPATH=$PWD/.gpu/python MEMCAST_REQUIRE_GPU=1
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
mkdir -p /tmp/g && cp -r .gpu/. /tmp/g/ && printf '#!/bin/sh\nexit 0\n' > /tmp/g/cuda-measure && chmod +x /tmp/g/cuda-measure
(timeout ${AL_SUITE:-420} bash /tmp/g/gpu-tests.sh /tmp/gpu > /tmp/gpu-tests.log 2>&1; echo "suite rc $? after $(( $(date +%s) - start )) s" >> /tmp/gpu-tests.log) &
suite=$!
mkdir -p /tmp/w /tmp/t
names=$(awk -F'\t' '$4=="dynamic" && ($5=="train" || $5=="validation") {print $2}' training-data/corpus/manifest.tsv \
  | grep -v -e '^bert_dynseq_b16_train$' -e '^gpt2_dynbatch_s512_train_bf16$' -e '^gpt2_generate_dynamic$' -e '^resnet50_multiscale_b32_train$')
rec() {
  MEMCAST_ALLOC_CONF=predictive:true MEMCAST_LOG=memcast_alloc::predictive=trace timeout ${tmo:-200} \
    python3 scripts/corpus/record.py --workload $1 --mode memcast --tag predictive --out /tmp/w \
    --memcast-trace /tmp/t/$1_job.mctrace > /tmp/w/$1.log 2>&1; echo "$1 exit $? at $(( $(date +%s) - start )) s"
}
export -f rec; export start
echo $names | tr ' ' '\n' | xargs -P 4 -I{} bash -c 'rec {}'
cat /tmp/w/*.json > $OUT/AL-predictive-gpu.jsonl 2>/dev/null
tar czf $OUT/AL-job-traces.tgz -C /tmp/t . && ls -la /tmp/t
tar czf $OUT/AL-logs.tgz -C /tmp/w $(cd /tmp/w && ls *.log)
wait $suite
cp /tmp/gpu-tests.log $OUT/AL-gpu-tests.log
tar czf $OUT/AL-gpu-suite.tgz -C /tmp gpu
tail -3 /tmp/gpu-tests.log
echo "total $(( $(date +%s) - start )) s"
