#!/bin/bash
# Run AR: the whole GPU suite (scripts/gpu-tests.sh from a staged folder) at the code of
# the first iteration's stream of returns (predictive tiers; no GPU path of a job uses
# it); then tiered replays at 60% of peak on the device (real spills, prefetches and
# faults through the CUDA backend), reactive against predictive, on the bundled traces
# where the stream moved the simulated figures most (BERT-base, GPT-2, generation).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; figures in $OUT.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
start=$(date +%s)
timeout 420 ./gpu-tests.sh $OUT/gpu > /tmp/gpu-tests.out 2>&1; echo "gpu-tests exit $?"
grep -E "^== |test result|panicked|passed|failed" /tmp/gpu-tests.out | grep -v '^test .* ok$' | head -40
cp /tmp/gpu-tests.out $OUT/gpu-tests.out
echo "suite $(( $(date +%s) - start )) s"
for t in bert_base_b32_s128_train gpt2_generate_dynamic gpt2_b8_s1024_train_bf16; do
  timeout 100 ./memcast replay traces/$t.mctrace --device cuda --compare reactive,predictive --budget 0.6 --json > $OUT/tier-cuda-$t.json 2>$OUT/tier-cuda-$t.err
  echo "$t exit $?"
  python3 - "$OUT/tier-cuda-$t.json" <<'PY'
import json,sys
try:
    d=json.load(open(sys.argv[1]))
except Exception as e:
    print("  no json:", e); sys.exit()
for k,v in d.items():
    it=v.get('stall_per_iteration_us') or []
    print("  %-10s completed=%s ooms=%s stall=%.4f first-iteration=%.1fms spilled=%.2fGB prefetched=%.2fGB faults=%s hit=%.3f wall=%.1fs device=%s" % (k, v.get('completed'), v.get('ooms'), v.get('stall_overhead') or 0, (it[0] if it else 0)/1000, (v.get('spilled_bytes') or 0)/1e9, (v.get('prefetched_bytes') or 0)/1e9, v.get('faults'), v.get('prefetch_hit_rate') or 0, v.get('wall_secs') or 0, v.get('device')))
PY
done
echo "total $(( $(date +%s) - start )) s"
