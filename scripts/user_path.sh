#!/usr/bin/env bash
# A new user's path with memcast and PyTorch, end to end, each step's command printed
# before it runs (docs/cuda.md, "A new user's path, end to end"):
#
#   1. build the library and the CLI (in a checkout with cargo; a staged copy from
#      scripts/stage-gpu.sh has them already);
#   2. install the Python package, offline, with one command;
#   3. train GPT-2 small with memcast_torch.install();
#   4. record the run as a trace;
#   5. `memcast train` a forecaster on that trace;
#   6. train again with predictive mode on and that model;
#   7. train again with the recording as a placement profile.
#
#   scripts/user_path.sh [WORKDIR] [MODEL]     (MODEL: gpt2 (default), bert, resnet50)
#
# WORKDIR (default: a new temporary directory) receives the installed package, the trace,
# the model and one JSON line per training run (runs.jsonl). Exit status: non-zero at the
# first step that fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-$(mktemp -d)}"
model="${2:-gpt2}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
say() { printf '\n$ %s\n' "$*"; }
run() { say "$*"; "$@"; }

if [ -x "$here/memcast" ]; then
    # Staged layout (scripts/stage-gpu.sh): built elsewhere, copied beside this script.
    memcast="$here/memcast"
    lib="$here/libmemcast_torch.so"
    pkg="$here/python"
    scripts="$here"
    export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
else
    root="$(cd "$here/.." && pwd)"
    cd "$root"
    run cargo build --release -p memcast -p memcast-torch
    memcast="$root/target/release/memcast"
    lib="$root/target/release/libmemcast_torch.so"
    pkg="$root/allocator/torch/python"
    scripts="$root/scripts"
fi
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"

# 2. Install (no network, no dependency but the PyTorch already there). --target keeps
# this run out of the user's site-packages; `pip install --no-deps
# allocator/torch/python` is the command for a real install.
run python3 -m pip install --quiet --no-deps --no-index \
    --target "$work/site" "$pkg"
export PYTHONPATH="$work/site"
export MEMCAST_TORCH_LIB="$lib"
run python3 -c "import memcast_torch as mt; print('memcast_torch from', mt.__file__, 'library', mt.lib_path())"

# 3. Train with every CUDA allocation through memcast.
say "python3 $scripts/torch_bench.py --model $model --mode memcast --steps 20"
python3 "$scripts/torch_bench.py" --model "$model" --mode memcast --steps 20 | tee -a "$work/runs.jsonl"

# 4. Record the run from its first allocation (a warm-up step and 8 more).
run python3 "$scripts/torch_record.py" --model "$model" --steps 8 --from-start "$work/$model.mctrace"
run "$memcast" trace stats "$work/$model.mctrace"

# 5. A forecaster trained on the recording.
run "$memcast" train --traces "$work/$model.mctrace" -o "$work/model" --epochs 20

# 6. Predictive mode with that model.
say "MEMCAST_ALLOC_CONF=predictive:true,model:$work/model python3 $scripts/torch_bench.py --model $model --mode memcast --steps 20"
MEMCAST_ALLOC_CONF="predictive:true,model:$work/model" \
    python3 "$scripts/torch_bench.py" --model "$model" --mode memcast --steps 20 \
    | sed 's/^{/{"run": "predictive", /' | tee -a "$work/runs.jsonl"

# 7. The recording as a placement profile.
say "MEMCAST_ALLOC_CONF=placement_profile:$work/$model.mctrace python3 $scripts/torch_bench.py --model $model --mode memcast --steps 20"
MEMCAST_ALLOC_CONF="placement_profile:$work/$model.mctrace" \
    python3 "$scripts/torch_bench.py" --model "$model" --mode memcast --steps 20 \
    | sed 's/^{/{"run": "profile", /' | tee -a "$work/runs.jsonl"

# What each run shows: the predictive run used forecasts, the profile run missed nothing.
run python3 - "$work/runs.jsonl" <<'EOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
base, pred, prof = runs[-3], runs[-2], runs[-1]
for name, r in (("install()", base), ("predictive", pred), ("profile", prof)):
    print(f"{name:12} peak reserved {r['peak_reserved_bytes'] / 1e9:.3f} GB, "
          f"median step {r['median_step_ms']:.2f} ms")
assert pred["memcast_forecasts_used"], "predictive mode used no forecast"
p = prof["memcast_placement"]
assert p and p["profile_hits"] > 0 and p["profile_misses"] == 0, p
print("ok")
EOF
echo "user path: every step passed (files in $work)"
