#!/bin/bash
# The fast-path cost on the H200 host (16 cores, nothing else running), pinned to two
# cores (the allocating thread and the forecast thread), three criterion runs of the
# pair and the alternating example; then tiered replays at 60% of peak on the device
# (real spills and prefetches through the CUDA backend), reactive against predictive.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib:${LD_LIBRARY_PATH:-}
start=$(date +%s)
nproc; uptime
for i in 1 2 3; do
  taskset -c 4,5 ./alloc_free-bench --bench 'alloc_free/memcast' --warm-up-time 3 --measurement-time 8 2>&1 \
    | grep -E "^alloc_free/|time:|thrpt:" | tee -a $OUT/criterion.log
done
taskset -c 4,5 ./predictive_cost 2>&1 | tail -8 | tee $OUT/predictive-cost.log
for t in gpt2_generate_dynamic resnet50_b64_train gpt2_dynbatch_s512_train_bf16; do
  timeout 150 ./memcast replay traces/$t.mctrace --device cuda --compare reactive,predictive --budget 0.6 --json > $OUT/tier-cuda-$t.json 2>$OUT/tier-cuda-$t.err
  echo "$t exit $?"
  python3 - "$OUT/tier-cuda-$t.json" <<'PY'
import json,sys
try:
    d=json.load(open(sys.argv[1]))
except Exception as e:
    print("  no json:", e); sys.exit()
for k,v in d.items():
    print("  %-10s completed=%s ooms=%s stall=%.4f spilled=%.2fGB prefetched=%.2fGB faults=%s hit=%.3f wall=%.1fs device=%s" % (k, v.get('completed'), v.get('ooms'), v.get('stall_overhead') or 0, (v.get('spilled_bytes') or 0)/1e9, (v.get('prefetched_bytes') or 0)/1e9, v.get('faults'), v.get('prefetch_hit_rate') or 0, v.get('wall_secs') or 0, v.get('device')))
PY
done
echo "total $(( $(date +%s) - start )) s"
