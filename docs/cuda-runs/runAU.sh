#!/bin/bash
# Run AU: the held-out (test) split of the recorded corpus replayed on the GPU under a
# budget of 60% of each trace's peak, reactive against predictive tiers (the default
# actions, the built-in LSTM), with real device memory, pinned host buffers and
# copies: `memcast replay T --device cuda --compare reactive,predictive --budget 0.6
# --json`, every trace once, then again in reverse order until 420 s have passed.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root (the traces are the checkout's); figures in $OUT.
set -u
root=$PWD
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
start=$(date +%s)
traces=$(ls $root/training-data/corpus/test/*.mctrace)
for round in 1 2; do
  [ $round = 2 ] && traces=$(echo "$traces" | tac)
  for f in $traces; do
    if [ $(( $(date +%s) - start )) -gt 420 ]; then echo "out of time before $f round $round"; break 2; fi
    t=$(basename $f .mctrace)
    o=$OUT/$t-$round.json
    timeout 60 ./memcast replay $f --device cuda --compare reactive,predictive --budget 0.6 --json > $o 2> $OUT/$t-$round.err
    echo "exit $? $t $round $(( $(date +%s) - start )) s"
    python3 - "$o" "$t" "$round" <<'PY'
import json,sys
try:
    d=json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], "no json:", e); sys.exit()
for k,v in d.items():
    print("%-28s %s %-10s completed=%s ooms=%s stall=%.4f blocked=%.0fms spilled=%.1fGB faults=%s hit=%.3f relocations=%s wall=%.1fs" % (sys.argv[2], sys.argv[3], k, v.get('completed'), v.get('ooms'), v.get('stall_overhead') or 0, (v.get('stall_us') or 0)/1e3, (v.get('spilled_bytes') or 0)/1e9, v.get('faults'), v.get('prefetch_hit_rate') or 0, v.get('relocations'), v.get('wall_secs') or 0))
PY
  done
done
echo "total $(( $(date +%s) - start )) s"
