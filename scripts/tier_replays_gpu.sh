#!/usr/bin/env bash
# Tiered replays of one split of a trace corpus on the GPU, reactive against predictive
# tiers: `memcast replay T --device cuda --compare reactive,predictive --budget B --json`
# for every trace of the split, each replay's whole JSON (with the trace's name added)
# appended to one file, OUT/tier-replays.jsonl, and a line per policy on stdout. One file,
# because a device machine returns a limited number of files. Traces are started until
# LIMIT seconds have passed, then again in reverse order while time is left.
#
#   scripts/tier_replays_gpu.sh OUT [MANIFEST] [SPLIT] [BUDGET] [LIMIT]
#
# Defaults: training-data/corpus/manifest.tsv, test, 0.6, 420. MEMCAST_REPLAY_ARGS, if
# set, is added to every replay's arguments (e.g. "--pinned 25% --early-pageable"), and
# recorded with each line of the JSON file. Run from the repository
# root (or from a folder staged by scripts/stage-gpu.sh, which copies this script beside
# the `memcast` binary); the manifest's paths are read from where it lies.
set -u
out="${1:?usage: scripts/tier_replays_gpu.sh OUT [MANIFEST] [SPLIT] [BUDGET] [LIMIT]}"
manifest="${2:-training-data/corpus/manifest.tsv}"
split="${3:-test}"
budget="${4:-0.6}"
limit="${5:-420}"
here="$(cd "$(dirname "$0")" && pwd)"
memcast="$here/memcast"
[ -x "$memcast" ] || memcast="$here/../target/release/memcast"
[ -x "$memcast" ] || { echo "no memcast binary beside this script or in target/release" >&2; exit 2; }
[ -d "$here/lib" ] && export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
base="$(dirname "$manifest")"
traces=$(awk -F'\t' -v s="$split" 'NR > 1 && $5 == s { print $1 }' "$manifest")
[ -n "$traces" ] || { echo "$manifest: no trace of split '$split'" >&2; exit 2; }
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
start=$(date +%s)
for round in 1 2; do
  [ "$round" = 2 ] && traces=$(echo "$traces" | tac)
  for f in $traces; do
    if [ $(( $(date +%s) - start )) -gt "$limit" ]; then echo "out of time before $f (round $round)"; break 2; fi
    name=$(basename "$f" .mctrace)
    json=$(timeout 120 "$memcast" replay "$base/$f" --device cuda --compare reactive,predictive \
      --budget "$budget" ${MEMCAST_REPLAY_ARGS:-} --json 2>>"$out/tier-replays.err")
    echo "$json" | python3 -c '
import json, sys
name, rnd, out = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.load(sys.stdin)
except ValueError:
    print("%s round %s: no JSON (see tier-replays.err)" % (name, rnd)); sys.exit()
with open(out, "a") as f:
    f.write(json.dumps({"trace": name, "round": int(rnd), "args": sys.argv[4], "replays": d}) + "\n")
for k, v in sorted(d.items()):
    print("%-28s %s %-10s completed=%s ooms=%s stall=%.4f blocked=%.0fms faults=%s fault=%.0fms hit=%.3f wall=%.1fs" % (
        name, rnd, k, v["completed"], v["ooms"], v["stall_overhead"], v["stall_us"] / 1e3,
        v["faults"], v["fault_us"] / 1e3, v["prefetch_hit_rate"], v["wall_secs"]))
' "$name" "$round" "$out/tier-replays.jsonl" "${MEMCAST_REPLAY_ARGS:-}"
  done
done
echo "total $(( $(date +%s) - start )) s"
