#!/bin/bash
# Page release waiting for the pool's stream only (not the device), on the H200: the
# CUDA backend and memcast-torch tests, four workloads under page_release:peak
# (scripts/corpus/record.py --mode memcast), then (second call, `python`) the Python tests.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib
export MEMCAST_TORCH_LIB=$PWD/libmemcast_torch.so PYTHONPATH=$PWD/python MEMCAST_REQUIRE_GPU=1
if [ "${1:-}" = python ]; then
  (cd python && timeout 560 python3 -m pytest -q -p no:cacheprovider tests) > $OUT/python-tests.log 2>&1; echo "python exit $?"
  tail -5 $OUT/python-tests.log
  exit 0
fi
export MEMCAST_CUDA_REPORT=$OUT/cuda-figures.jsonl
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "== cuda tests"
timeout 300 ./cuda-tests --test-threads=1 --nocapture > $OUT/cuda-tests.log 2>&1; echo "cuda-tests exit $?"
grep -E "^test |test result|panicked" $OUT/cuda-tests.log | tail -40
echo "== torch tests"
timeout 120 ./torch-tests --test-threads=1 > $OUT/torch-tests.log 2>&1; echo "torch-tests exit $?"
grep -E "test result|panicked" $OUT/torch-tests.log
mkdir -p $OUT/workloads
for w in gpt2_b16_s512_bf16_ckpt bert_b16_s512_bf16_adamw llama_b16_s1024_ckpt_bf16 unet_b16_128px_bf16_ckpt; do
  echo "== $w peak"
  MEMCAST_ALLOC_CONF=page_release:peak timeout 100 python3 corpus/record.py --workload $w --mode memcast --tag peak --out $OUT/workloads > $OUT/workloads/$w.peak.log 2>&1; echo "exit $?"
  tail -c 400 $OUT/workloads/$w.peak.log
done
cat $OUT/workloads/*.json > $OUT/page-release.jsonl 2>/dev/null
