#!/usr/bin/env bash
# Replays recordings of whole jobs (what memcast saw from before the model was built:
# `record.py --memcast-trace`) through memcast reactive and predictive mode; one line
# per trace with, for each, the device calls after the setup (the events before the
# job's first boundary: the model built, the warm-up, the first recorded iteration;
# calls ahead of need included, then counted apart) and the reserved overhead.
#
#   scripts/job_replays.sh [TRACES...] [-- more replay options]
#
# Default traces: training-data/corpus/jobs/*.mctrace. With `-- --real-time` the
# forecast thread runs at the trace's own pace.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
traces=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do traces+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#traces[@]} -eq 0 ] && traces=(training-data/corpus/jobs/*.mctrace)
cargo build --release -q -p memcast
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
for f in "${traces[@]}"; do
  ./target/release/memcast replay "$f" --compare memcast,predictive --json "$@" > "$tmp"
  python3 - "$f" "$tmp" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[2]))
row = [os.path.basename(sys.argv[1]).removesuffix(".mctrace").ljust(36)]
for k in ("memcast", "predictive"):
    v = d[k]
    calls = sum(v["device_calls_per_iteration"])
    row.append("%s: calls %3d (ahead %3d), overhead %6.2f%%" % (
        k, calls, v.get("ahead_device_calls", 0), 100 * v["reserved_overhead"]))
print(" | ".join(row))
PY
done
