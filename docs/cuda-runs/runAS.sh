#!/bin/bash
# Run AS: relocation (the out-of-memory path opens a window by moving its tensors on
# the device) on the GPU. The CUDA backend tests (allocator/tests/cuda.rs, which now hold
# `cuda_tier::relocation_moves_tensors_with_device_copies`: bytes moved with
# cuMemcpyDtoDAsync read back intact), then tiered replays at 60% of peak on the device
# (real spills, prefetches, faults and device-to-device relocations through the CUDA
# backend), reactive against predictive, on four bundled traces whose simulated stall
# relocation moved. No Python or torch path changed: the rest of the suite is not rerun.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; figures in $OUT.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
start=$(date +%s)
timeout 240 ./cuda-tests --include-ignored --test-threads=1 --nocapture > $OUT/cuda-tests.log 2>&1
echo "cuda-tests exit $?"
grep -E "^test |test result|panicked" $OUT/cuda-tests.log | sed 's/ \.\.\. {.*/ .../' | head -30
grep relocation $OUT/cuda-report.jsonl
echo "tests $(( $(date +%s) - start )) s"
for t in gpt2_b8_s1024_train_bf16 bert_base_b32_s128_train resnet50_b64_train mobilenet_v3_b128_train; do
  timeout 90 ./memcast replay traces/$t.mctrace --device cuda --compare reactive,predictive --budget 0.6 --json > $OUT/tier-cuda-$t.json 2>$OUT/tier-cuda-$t.err
  echo "$t exit $?"
  python3 - "$OUT/tier-cuda-$t.json" <<'PY'
import json,sys
try:
    d=json.load(open(sys.argv[1]))
except Exception as e:
    print("  no json:", e); sys.exit()
for k,v in d.items():
    print("  %-10s completed=%s ooms=%s stall=%.4f spilled=%.2fGB faults=%s hit=%.3f relocations=%s relocated=%.2fGB relocate=%.1fms wall=%.1fs device=%s" % (k, v.get('completed'), v.get('ooms'), v.get('stall_overhead') or 0, (v.get('spilled_bytes') or 0)/1e9, v.get('faults'), v.get('prefetch_hit_rate') or 0, v.get('relocations'), (v.get('relocated_bytes') or 0)/1e9, (v.get('oom_relocate_us') or 0)/1e3, v.get('wall_secs') or 0, v.get('device')))
PY
done
echo "total $(( $(date +%s) - start )) s"
