#!/usr/bin/env bash
# scripts/dist_bench.py for DDP and FSDP under every allocator, one JSON line each:
#   scripts/dist_bench_all.sh [NPROC] [STEPS] > dist.jsonl 2> dist.err
# NPROC ranks (default 1), one per GPU, over NCCL. Needs memcast_torch importable
# (PYTHONPATH) and MEMCAST_TORCH_LIB, as gpu-tests.sh sets. Each run's own messages go
# to stderr; a run that fails or passes 300 s prints {"failed": true, ...} instead.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nproc="${1:-1}"
steps="${2:-20}"
for wrap in ddp fsdp; do
    for mode in native expandable memcast; do
        line=$(timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
            "$here/dist_bench.py" --wrap "$wrap" --mode "$mode" --steps "$steps" | tail -1)
        case "$line" in
            "{"*) echo "$line" ;;
            *) echo "{\"wrap\": \"$wrap\", \"mode\": \"$mode\", \"world_size\": $nproc, \"failed\": true}" ;;
        esac
    done
done
