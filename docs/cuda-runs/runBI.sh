#!/bin/bash
# Run BI: spill hysteresis with an exception for allocations that would pass the budget,
# on the device, at commit 6be377c, where it was the rule of
# `TierConfig::spill_hysteresis` and on by default, `--no-spill-hysteresis` turning it off
# (turned back in the next commit: docs/tiers.md, "Spill hysteresis"). First the CUDA
# backend tests, then every test trace of the held-out split replayed through the CUDA
# backend at 60%, reactive against predictive, with the default and with
# --no-spill-hysteresis one after the other (which goes first alternates by trace), until
# LIMIT seconds have passed. Every replay's JSON in $OUT/ab.jsonl with its
# arguments (`args: ""` is the default).
# Two calls on one warm machine (a call may run 10 minutes): `FROM=0 TO=13 LIMIT=480`
# with the tests, then `FROM=12 TO=26 TESTS=0 LIMIT=570`.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root. Ran on an H100 80GB HBM3 in two calls (492 s and 437 s; the first
# ran llama_generate_dynamic with the default only before its limit, the second ran it
# both ways: runBI-ab.jsonl holds all three, the means take the second's). The tests'
# 100 s timeout cut them short: 13 of 18 passed before it, a 14th was stopped while it
# ran and 4 did not start (runBI-cuda-tests.log). Every replay completed with no out-of-memory error. Means of
# the 26, without -> with: reactive 1.9036 -> 1.9069 (13 lower, 13 higher, at full
# precision), predictive 1.5215 -> 1.5205 (12 lower, 14 higher).
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1
limit=${LIMIT:-480}
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ "${TESTS:-1}" = 1 ] && timeout 100 "$here/cuda-tests" --include-ignored --test-threads=1 > $OUT/cuda-tests.log 2>&1
if [ "${TESTS:-1}" = 1 ]; then
  echo "cuda-tests after $(( $(date +%s) - start )) s"
  grep -E "test result|panicked|FAILED" $OUT/cuda-tests.log | head -20
fi
i=${FROM:-0}
for t in $(awk -F'\t' '$5=="test"{print $2}' "$root/training-data/corpus/manifest.tsv" | sed -n "$((${FROM:-0} + 1)),${TO:-26}p"); do
  if [ $((i % 2)) -eq 0 ]; then order=("" "--no-spill-hysteresis"); else order=("--no-spill-hysteresis" ""); fi
  i=$((i + 1))
  for args in "${order[@]}"; do
    [ $(( $(date +%s) - start )) -gt "$limit" ] && { echo "out of time before $t $args"; break 2; }
    json=$(timeout 60 "$here/memcast" replay "$root/training-data/corpus/test/$t.mctrace" --device cuda \
      --compare reactive,predictive --budget 0.6 $args --json 2>>$OUT/ab.err)
    echo "$json" | python3 -c '
import json, sys
t, args, out = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.load(sys.stdin)
except ValueError:
    print(t, args, "no JSON"); sys.exit()
open(out, "a").write(json.dumps({"trace": t, "args": args, "replays": d}) + "\n")
print("%-28s %-22s reactive %.4f predictive %.4f" % (t, args or "default", d["reactive"]["stall_overhead"], d["predictive"]["stall_overhead"]))
' "$t" "$args" $OUT/ab.jsonl
  done
done
echo "total $(( $(date +%s) - start )) s"
