#!/usr/bin/env bash
# Every model under every allocator (scripts/torch_bench.py), one JSON line each:
#   scripts/torch_bench_all.sh [STEPS] > bench.jsonl
# Needs memcast_torch importable (PYTHONPATH) and MEMCAST_TORCH_LIB, as gpu-tests.sh sets.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
steps="${1:-20}"
for model in resnet50 gpt2 bert; do
    for mode in native expandable memcast memcast-pool memcast-predictive; do
        timeout 180 python3 "$here/torch_bench.py" --model "$model" --mode "$mode" --steps "$steps" 2>/dev/null | tail -1 \
            || echo "{\"model\": \"$model\", \"mode\": \"$mode\", \"failed\": true}"
    done
    # memcast with 32 MiB pages for its growable segments.
    MEMCAST_ALLOC_CONF=segment_granule:32M timeout 180 python3 "$here/torch_bench.py" --model "$model" --mode memcast --steps "$steps" 2>/dev/null \
        | tail -1 | sed 's/"mode": "memcast"/"mode": "memcast-page32M"/' \
        || echo "{\"model\": \"$model\", \"mode\": \"memcast-page32M\", \"failed\": true}"
done
