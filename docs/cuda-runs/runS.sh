#!/bin/bash
# Page release on the H200: the CUDA backend tests, then four workloads recorded with
# scripts/corpus/record.py --mode memcast, page_release:on_oom (default) and :peak.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib
export MEMCAST_TORCH_LIB=$PWD/libmemcast_torch.so PYTHONPATH=$PWD/python MEMCAST_REQUIRE_GPU=1
export MEMCAST_CUDA_REPORT=$OUT/cuda-figures.jsonl
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "== cuda tests"
timeout 300 ./cuda-tests --test-threads=1 --nocapture > $OUT/cuda-tests.log 2>&1; echo "cuda-tests exit $?"
grep -E "^test |test result|panicked" $OUT/cuda-tests.log | tail -40
mkdir -p $OUT/workloads
for w in gpt2_b16_s512_bf16_ckpt bert_b16_s512_bf16_adamw llama_b16_s1024_ckpt_bf16 unet_b16_128px_bf16_ckpt; do
  for m in on_oom peak; do
    echo "== $w $m"
    MEMCAST_ALLOC_CONF=page_release:$m timeout 100 python3 corpus/record.py --workload $w --mode memcast --tag $m --out $OUT/workloads > $OUT/workloads/$w.$m.log 2>&1; echo "exit $?"
    tail -c 900 $OUT/workloads/$w.$m.log
  done
done
