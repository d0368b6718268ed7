#!/bin/bash
# Run AY (an H100): the CUDA test that a copy to pageable memory is host time the stall
# counts, with the pinned/pageable copy test beside it (runAY-cuda-report.jsonl); then,
# on the same warm machine, the two held-out traces whose reactive tiers spill to
# pageable memory, tiered at 60%, reactive against predictive (runAY-pageable.jsonl):
#   scripts/tier_replays_gpu.sh OUT MANIFEST test 0.6 LIMIT
# with MANIFEST the corpus manifest's header and the line of `llama_lora_b8_s1024_bf16`
# (LIMIT 0: one round), then of `sage_dyngraph` (LIMIT 40: two rounds).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; figures in $OUT.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-report.jsonl
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 "$here/cuda-tests" --test-threads=1 copies a_copy_to_pageable 2>&1 | tail -15
cat $OUT/cuda-report.jsonl
