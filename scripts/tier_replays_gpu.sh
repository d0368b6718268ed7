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
# recorded with each line of the JSON file. MEMCAST_AB_ARGS, if set, makes it an A/B
# run: each trace is replayed twice in a row, without and with those arguments too
# (which goes first alternates from trace to trace, so that a drift of the machine
# does not favour one side), one round only, and the means of both sides and the
# traces each side is lower on are printed at the end. MEMCAST_FROM=N starts at the
# split's N-th trace (from 0), to go on from where a call ran out of time. Run from the
# repository root (or from a folder staged by scripts/stage-gpu.sh, which copies this
# script beside the `memcast` binary); the manifest's paths are read from where it lies.
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
from="${MEMCAST_FROM:-0}"
traces=$(echo "$traces" | tail -n +"$((from + 1))")
ab="${MEMCAST_AB_ARGS:-}"
rounds="1 2"
[ -n "$ab" ] && rounds=1
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
start=$(date +%s)
i=$from
for round in $rounds; do
  [ "$round" = 2 ] && traces=$(echo "$traces" | tac)
  for f in $traces; do
    sides=("")
    if [ -n "$ab" ]; then
      if [ $((i % 2)) = 0 ]; then sides=("" "$ab"); else sides=("$ab" ""); fi
    fi
    i=$((i + 1))
    name=$(basename "$f" .mctrace)
    for side in "${sides[@]}"; do
      if [ $(( $(date +%s) - start )) -gt "$limit" ]; then echo "out of time before $f (round $round)${side:+ with $side}"; break 3; fi
      # As the summary below spells them: a space between the two only when both are set.
      args="${MEMCAST_REPLAY_ARGS:-}"
      [ -n "$side" ] && args="${args:+$args }$side"
      # shellcheck disable=SC2086 # the arguments are words
      json=$(timeout 120 "$memcast" replay "$base/$f" --device cuda --compare reactive,predictive \
        --budget "$budget" $args --json 2>>"$out/tier-replays.err")
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
    print("%-28s %s %-10s completed=%s ooms=%s stall=%.4f blocked=%.0fms faults=%s fault=%.0fms hit=%.3f wall=%.1fs %s" % (
        name, rnd, k, v["completed"], v["ooms"], v["stall_overhead"], v["stall_us"] / 1e3,
        v["faults"], v["fault_us"] / 1e3, v["prefetch_hit_rate"], v["wall_secs"], sys.argv[4]))
      ' "$name" "$round" "$out/tier-replays.jsonl" "$args"
    done
  done
done
echo "total $(( $(date +%s) - start )) s"
if [ -n "$ab" ] && [ -f "$out/tier-replays.jsonl" ]; then
  python3 - "$out/tier-replays.jsonl" "${MEMCAST_REPLAY_ARGS:-}" "$ab" <<'PY'
import json, sys
path, base, ab = sys.argv[1], sys.argv[2], sys.argv[3]
with_ab = (base + " " + ab).strip()
runs = {}
for line in open(path):
    r = json.loads(line)
    if r["args"] in (base, with_ab):
        # A trace replayed again (a later call) counts with its last replay.
        runs[(r["trace"], r["args"] == with_ab)] = r["replays"]
both = sorted({t for t, _ in runs if (t, False) in runs and (t, True) in runs})
if not both:
    sys.exit("no trace replayed both ways")
for policy in sorted(runs[(both[0], False)]):
    a = [runs[(t, False)][policy]["stall_overhead"] for t in both]
    b = [runs[(t, True)][policy]["stall_overhead"] for t in both]
    print("%s, %d traces both ways: without %.4f, with %s %.4f; lower with it on %d, higher on %d" % (
        policy, len(both), sum(a) / len(a), ab, sum(b) / len(b),
        sum(y < x for x, y in zip(a, b)), sum(y > x for x, y in zip(a, b))))
PY
fi
