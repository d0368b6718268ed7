#!/bin/bash
# The whole GPU suite (scripts/gpu-tests.sh from a staged folder: CUDA backend tests,
# memcast-torch tests, Python tests, replays on the device) after victims by next use
# began predicting the frees of tensors of a new shape and a device error backing
# released pages became the request's error.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
start=$(date +%s)
timeout 560 ./gpu-tests.sh $OUT/gpu > /tmp/gpu-tests.out 2>&1; echo "gpu-tests exit $?"
grep -E "^== |test result|panicked|passed|failed" /tmp/gpu-tests.out | grep -v '^test .* ok$' | head -40
cp /tmp/gpu-tests.out $OUT/gpu-tests.out
echo "total $(( $(date +%s) - start )) s"
