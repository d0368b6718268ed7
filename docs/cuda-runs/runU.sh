#!/bin/bash
# Page release at the peak with and without planned placement, on the H200: the CUDA
# backend and memcast-torch tests, then five workloads (scripts/corpus/record.py --mode
# memcast, 16 recorded iterations) under page_release:peak,placement:planned,
# page_release:peak and the default (page_release:on_oom): per-iteration wall times and
# pages moved.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib
export MEMCAST_TORCH_LIB=$PWD/libmemcast_torch.so PYTHONPATH=$PWD/python MEMCAST_REQUIRE_GPU=1
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "== cuda tests"
timeout 120 ./cuda-tests --test-threads=1 > $OUT/cuda-tests.log 2>&1; echo "cuda-tests exit $?"
grep -E "test result|panicked" $OUT/cuda-tests.log | tail -5
echo "== torch tests"
timeout 120 ./torch-tests --test-threads=1 > $OUT/torch-tests.log 2>&1; echo "torch-tests exit $?"
grep -E "test result|panicked" $OUT/torch-tests.log
mkdir -p $OUT/workloads
for w in gpt2_b16_s512_bf16_ckpt llama_b16_s1024_ckpt_bf16 unet_b16_128px_bf16_ckpt bert_b16_s512_bf16_adamw mixtral_b8_s512_bf16; do
  for c in planned:page_release:peak,placement:planned peak:page_release:peak on_oom:page_release:on_oom; do
    tag=${c%%:*}; conf=${c#*:}
    if [ $(( $(date +%s) - start )) -gt 500 ]; then echo "skip $w $tag (time)"; continue; fi
    MEMCAST_ALLOC_CONF=$conf timeout 110 python3 corpus/record.py --workload $w --mode memcast --tag $tag --iters 16 --out $OUT/workloads > $OUT/workloads/$w.$tag.log 2>&1; echo "$w $tag exit $?"
    python3 - "$OUT/workloads/$w.memcast-$tag.json" <<'PY'
import json, sys
try:
    f = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no figures:", e); sys.exit(0)
it = f["iteration_s"]; half = sorted(it[len(it) // 2:])
print(f"  overhead {f['reserved_overhead']*100:.2f}%  median iteration {f['median_iteration_s']*1e3:.0f} ms, last 8 {half[len(half)//2]*1e3:.0f} ms  pages moved {f['pages_moved_per_iteration']}")
print("  iteration ms", [round(x * 1e3) for x in it])
PY
  done
done
cat $OUT/workloads/*.json > $OUT/page-release.jsonl 2>/dev/null
echo "total $(( $(date +%s) - start )) s"
