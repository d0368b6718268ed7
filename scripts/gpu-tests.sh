#!/usr/bin/env bash
# GPU tests of the CUDA backend and of memcast_torch, in one command, on a machine with
# an NVIDIA GPU and its driver (PyTorch with CUDA and pytest for the Python part).
#
#   scripts/gpu-tests.sh [OUTDIR]
#
# In a checkout with cargo it builds what it needs (cargo build --release -p memcast
# -p memcast-torch; cargo test --no-run). On a machine without a Rust toolchain, stage
# the binaries first with `scripts/stage-gpu.sh DIR` and run `DIR/gpu-tests.sh` there:
# the staged copy finds them beside itself. OUTDIR (default: ./gpu-out) receives the
# logs and cuda-figures.jsonl (the figures the tests measured).
#
# MEMCAST_REQUIRE_GPU=1 is set: a missing driver fails the GPU tests instead of
# skipping them. Exit status: non-zero if any part failed (every part still runs).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$PWD/gpu-out}"
mkdir -p "$out"
export MEMCAST_REQUIRE_GPU=1
export MEMCAST_CUDA_REPORT="$out/cuda-figures.jsonl"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:/usr/local/nvidia/lib64"
rm -f "$MEMCAST_CUDA_REPORT"

if [ -x "$here/cuda-tests" ]; then
    # Staged layout (scripts/stage-gpu.sh).
    cuda_tests="$here/cuda-tests"
    cuda_measure="$here/cuda-measure"
    torch_tests="$here/torch-tests"
    memcast="$here/memcast"
    export MEMCAST_TORCH_LIB="$here/libmemcast_torch.so"
    py="$here/python"
    traces="$here/traces"
    # Shared libraries the CLI links (fontconfig, freetype, ...), copied by stage-gpu.sh.
    export LD_LIBRARY_PATH="$here/lib:$LD_LIBRARY_PATH"
else
    root="$(cd "$here/.." && pwd)"
    cd "$root"
    cargo build --release -p memcast -p memcast-torch || exit 1
    cuda_tests=$(cargo test --release -p memcast-alloc --test cuda --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]=="cuda"]' | tail -1)
    cuda_measure=$(cargo test --release -p memcast-alloc --test cuda_measure --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]=="cuda_measure"]' | tail -1)
    torch_tests=$(cargo test --release -p memcast-torch --lib --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]=="memcast_torch"]' | tail -1)
    memcast="$root/target/release/memcast"
    export MEMCAST_TORCH_LIB="$root/target/release/libmemcast_torch.so"
    py="$root/allocator/torch/python"
    traces="$root/training-data/traces"
fi
export MEMCAST_BIN="$memcast"
status=0
step() { echo "== $1"; }

step "Rust: CUDA backend tests (allocator/tests/cuda.rs)"
"$cuda_tests" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$out/rust-cuda-tests.log" || status=1
step "Rust: CUDA measurements (allocator/tests/cuda_measure.rs)"
"$cuda_measure" --test-threads=1 --nocapture 2>&1 | tee "$out/rust-cuda-measure.log" || status=1
step "Rust: memcast_torch library tests"
"$torch_tests" --test-threads=1 2>&1 | tee "$out/rust-torch-tests.log" || status=1
step "Python: memcast_torch tests"
(cd "$py" && python3 -m pytest -q -p no:cacheprovider tests) 2>&1 | tee "$out/python-tests.log" || status=1
step "memcast replay --device cuda"
for t in resnet50_b64_train gpt2_b8_s1024_train_bf16; do
    "$memcast" replay "$traces/$t.mctrace" --device cuda 2>&1 | tee "$out/replay-cuda-$t.txt" || status=1
    "$memcast" replay "$traces/$t.mctrace" --device cuda --json > "$out/replay-cuda-$t.json" || status=1
    # Without --costs the measured calls are set beside the model of the GPU the driver
    # names (the JSON's `gpu`): on an H100 or H200, that GPU's own.
    python3 - "$out/replay-cuda-$t.json" <<'PY' || status=1
import json, sys
r = json.load(open(sys.argv[1]))
words = r.get("gpu", "").split(" ")
want = next((m.lower() for m in ("H100", "H200") if m in words), None)
if want and r.get("costs") != want:
    sys.exit(f"FAIL: replay on an {r['gpu']} compared its calls with the costs {r.get('costs')!r}")
print(f"gpu {r.get('gpu')!r}, costs {r.get('costs')!r}")
PY
    # 32 MiB pages for growable segments (one cuMemCreate + cuMemMap per 32 MiB).
    "$memcast" replay "$traces/$t.mctrace" --device cuda --conf segment_granule:32M --json \
        > "$out/replay-cuda-$t-page32M.json" || status=1
done
echo "== done: status $status (logs in $out)"
exit $status
