#!/bin/bash
# The whole GPU suite (scripts/gpu-tests.sh from a staged folder: CUDA backend tests,
# memcast-torch tests, Python tests, replays on the device) after the out-of-memory
# paths began releasing in two rounds; the new CUDA test
# predictive_mode_under_a_cap_places_and_fails_as_reactive_does runs in it.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
start=$(date +%s)
timeout 560 ./gpu-tests.sh $OUT/gpu > /tmp/gpu-tests.out 2>&1; echo "gpu-tests exit $?"
grep -E "^== |test result|panicked|passed|failed|predictive_mode_under_a_cap" /tmp/gpu-tests.out | grep -v '^test .* ok$' | head -40
grep -h "predictive_mode_under_a_cap" $OUT/gpu/cuda-figures.jsonl
echo "total $(( $(date +%s) - start )) s"
