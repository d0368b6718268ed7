#!/usr/bin/env bash
# Leave-one-out evaluation on the bundled real traces: for each trace, train on the
# others (plus the traces in $EXTRA, e.g. a synthetic set), evaluate on it.
# Usage: [EXTRA=dir] predictor/scripts/loo.sh [MEMCAST] [OUTDIR] [train args...]
set -euo pipefail
BIN=${1:-target/debug/memcast}
OUT=${2:-/tmp/memcast-loo}
shift 2 || true
mkdir -p "$OUT"
for f in training-data/traces/*.mctrace; do
  n=$(basename "$f" .mctrace)
  "$BIN" train --traces training-data/traces ${EXTRA:-} --exclude "$n" -o "$OUT/$n" "$@" >"$OUT/$n.train.log" 2>&1
  "$BIN" eval --model "$OUT/$n" --trace "$f" --json >"$OUT/$n.json"
done
python3 - "$OUT" <<'PY'
import json, sys, glob, os
print(f"{'trace':32} {'lstm':>7} {'last':>7} {'ma':>7} {'seas':>7} {'s_resc':>7} {'ratio':>6}")
for p in sorted(glob.glob(os.path.join(sys.argv[1], '*.json'))):
    r = json.load(open(p)); m = r['models']
    print(f"{r['trace'][:32]:32} " + ' '.join(f"{m[k]['wape']:7.4f}" for k in
          ['lstm', 'last_value', 'moving_average', 'seasonal_naive', 'seasonal_rescaled'])
          + f" {r['lstm_vs_best_baseline']:6.3f}")
PY
