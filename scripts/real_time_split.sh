#!/usr/bin/env bash
# Replays every dynamic trace of the corpus splits named (comma-separated) at the
# trace's own pace, with predictive mode's forecast thread in the loop, against
# reactive memcast; one line per trace:
#   TRACE (policy, calls inside requests after iteration 1, calls ahead,
#          reserved overhead %, forecasts used, advice applied) for each policy
#
#   scripts/real_time_split.sh train,validation [more replay options]
#
# Extra arguments go to `memcast replay` (e.g. `--conf KEY:VALUE`).
# Takes about the traces' span (2 minutes a split on a 2-core machine).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
splits="${1:?usage: scripts/real_time_split.sh SPLITS [replay options]}"
shift
cargo build --release -q -p memcast
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
awk -F'\t' -v s="$splits" '$4=="dynamic" && index(","s",", ","$5",") {print $1}' \
    training-data/corpus/manifest.tsv | while read -r f; do
  ./target/release/memcast replay "training-data/corpus/$f" --compare memcast,predictive \
      --real-time --json "$@" > "$tmp"
  python3 - "$f" "$tmp" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[2]))
row = [os.path.basename(sys.argv[1]).removesuffix(".mctrace")]
for k in ("memcast", "predictive"):
    v = d[k]
    e = v.get("extra") or {}
    row.append((k, v["critical_path_device_calls_after_first_iteration"],
                v.get("ahead_device_calls", 0), round(100 * v["reserved_overhead"], 2),
                e.get("forecasts_used", 0), e.get("advice_applied", 0)))
print(*row)
PY
done
