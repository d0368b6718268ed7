#!/bin/bash
# Run AT: the CUDA backend tests again at the code with relocation's review mends (run
# AS ran the build before them), then relocation on the device against
# `--no-relocate`: the same binary, alternated twice per trace, reactive and predictive
# tiered replays at 60% (`memcast replay TRACE --device cuda --compare
# reactive,predictive --budget 0.6 --json [--no-relocate]`).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; figures in $OUT.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
start=$(date +%s)
timeout 240 ./cuda-tests --include-ignored --test-threads=1 --nocapture > $OUT/cuda-tests.log 2>&1
echo "cuda-tests exit $?"
grep -E "test result|panicked|FAILED" $OUT/cuda-tests.log | head -20
grep relocation $OUT/cuda-report.jsonl
echo "tests $(( $(date +%s) - start )) s"
for t in gpt2_b8_s1024_train_bf16 bert_base_b32_s128_train resnet50_b64_train mobilenet_v3_b128_train; do
  for round in 1 2; do
    for mode in relocate no-relocate; do
      flag=""; [ $mode = no-relocate ] && flag="--no-relocate"
      f=$OUT/$t-$mode-$round.json
      timeout 90 ./memcast replay traces/$t.mctrace --device cuda --compare reactive,predictive --budget 0.6 --json $flag > $f 2>/dev/null
      python3 - "$f" "$t" "$mode" "$round" <<'PY'
import json,sys
try:
    d=json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], sys.argv[3], "no json:", e); sys.exit()
for k,v in d.items():
    print("%-26s %-11s %s %-10s stall=%.4f relocations=%s relocated=%.2fGB faults=%s hit=%.3f wall=%.1fs" % (sys.argv[2], sys.argv[3], sys.argv[4], k, v.get('stall_overhead') or 0, v.get('relocations'), (v.get('relocated_bytes') or 0)/1e9, v.get('faults'), v.get('prefetch_hit_rate') or 0, v.get('wall_secs') or 0))
PY
    done
  done
done
echo "total $(( $(date +%s) - start )) s"
