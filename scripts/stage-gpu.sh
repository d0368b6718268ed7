#!/usr/bin/env bash
# Builds everything scripts/gpu-tests.sh runs and copies it into DIR, for a GPU machine
# without a Rust toolchain (same architecture): then run `DIR/gpu-tests.sh [OUTDIR]`.
#
#   scripts/stage-gpu.sh DIR
set -euo pipefail
dir="${1:?usage: scripts/stage-gpu.sh DIR}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo build --release -p memcast -p memcast-torch
pick() { python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]==sys.argv[1]]' "$1" | tail -1; }
cuda_tests=$(cargo test --release -p memcast-alloc --test cuda --no-run --message-format=json | pick cuda)
cuda_measure=$(cargo test --release -p memcast-alloc --test cuda_measure --no-run --message-format=json | pick cuda_measure)
torch_tests=$(cargo test --release -p memcast-torch --lib --no-run --message-format=json | pick memcast_torch)
mkdir -p "$dir/traces"
cp "$cuda_tests" "$dir/cuda-tests"
cp "$cuda_measure" "$dir/cuda-measure"
cp "$torch_tests" "$dir/torch-tests"
cp target/release/memcast target/release/libmemcast_torch.so "$dir/"
rm -rf "$dir/python" && cp -r allocator/torch/python "$dir/python"
find "$dir/python" -name __pycache__ -prune -exec rm -rf {} +
cp scripts/gpu-tests.sh scripts/tier_replays_gpu.sh scripts/user_path.sh scripts/torch_bench.py scripts/torch_bench_all.sh scripts/torch_record.py scripts/oversub_bench.py scripts/oversub_replay.py \
    scripts/dist_bench.py scripts/dist_bench_all.sh "$dir/"
cp training-data/traces/*.mctrace "$dir/traces/"
# The CLI's shared libraries beyond glibc (plotters links fontconfig and freetype),
# which a GPU machine may lack; gpu-tests.sh puts DIR/lib on LD_LIBRARY_PATH.
mkdir -p "$dir/lib"
ldd target/release/memcast | awk '/=> \//{print $3}' \
    | grep -Ev '/(libc|libm|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
    | xargs -r -I{} cp -L {} "$dir/lib/"
# Debug info is not needed there (and the carried folder is size-limited).
if command -v strip >/dev/null; then
    strip --strip-debug "$dir/cuda-tests" "$dir/cuda-measure" "$dir/torch-tests" "$dir/memcast" "$dir/libmemcast_torch.so"
fi
du -sh "$dir"
echo "staged in $dir"
