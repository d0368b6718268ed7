#!/bin/bash
# The GPU suite at the code of the forecast thread's every-forecast publication, in two
# calls (the device's time was short): first the Rust CUDA tests and the measurement of a
# growable page's driver calls apart; then the rest of scripts/gpu-tests.sh (memcast_torch
# library tests, Python tests, `memcast replay --device cuda`), its two Rust binaries
# replaced by no-ops. Staged with scripts/stage-gpu.sh .gpu; figures in $OUT.
set -u
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-figures.jsonl LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
if [ "${1:-1}" = 1 ]; then
  nvidia-smi --query-gpu=name --format=csv,noheader
  .gpu/cuda-measure --test-threads=1 --nocapture measure_page_calls > $OUT/measure.log 2>&1; echo measure rc $?
  grep page_calls_and $OUT/cuda-figures.jsonl
  timeout 150 .gpu/cuda-tests --test-threads=1 > $OUT/cuda.log 2>&1; echo cuda rc $?
else
  mkdir -p /tmp/g && cp -r .gpu/. /tmp/g/ && printf '#!/bin/sh\nexit 0\n' > /tmp/g/cuda-tests
  cp /tmp/g/cuda-tests /tmp/g/cuda-measure && chmod +x /tmp/g/cuda-*
  timeout 290 bash /tmp/g/gpu-tests.sh $OUT/gpu > $OUT/gpu-tests.log 2>&1; echo rc $?
fi
