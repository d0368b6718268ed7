#!/bin/bash
# The GPU test suite (scripts/gpu-tests.sh, staged with scripts/stage-gpu.sh .gpu) on
# another GPU model than the H200 it was written on, and the copy bandwidths and device
# call costs that a cost model of that GPU needs (measure_copy_bandwidths,
# measure_device_call_latencies). Run from the repository root; logs go to $OUT/gpu.
set -u
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
start=$(date +%s)
bash .gpu/gpu-tests.sh $OUT/gpu > $OUT/gpu-tests.log 2>&1
echo "gpu-tests status $?"
grep -E "^test |test result|passed|failed|== " $OUT/gpu-tests.log | cut -c1-200 | tail -40
echo "total $(( $(date +%s) - start )) s"
# Then, on the same machine (a second call), twice more the copy bandwidths and once
# more the device calls, appended to the same figures:
#   for i in 1 2; do .gpu/cuda-tests --test-threads=1 --nocapture measure_copy_bandwidths pinned_copies; done
#   .gpu/cuda-tests --test-threads=1 --nocapture measure_device_call_latencies
# (with MEMCAST_REQUIRE_GPU=1 and MEMCAST_CUDA_REPORT set). runAD-cuda-figures.jsonl
# holds the figures of both calls; CostModel::h100 is their mean.
