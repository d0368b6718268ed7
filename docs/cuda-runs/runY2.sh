#!/bin/bash
# The Python part of the GPU suite (memcast_torch's pytest tests) alone: in run Y1 the
# suite's time limit cut it short.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_TORCH_LIB=$PWD/libmemcast_torch.so MEMCAST_BIN=$PWD/memcast
start=$(date +%s)
(cd python && timeout 540 python3 -m pytest -q -p no:cacheprovider tests) > $OUT/python-tests.log 2>&1; echo "pytest exit $?"
tail -5 $OUT/python-tests.log
echo "total $(( $(date +%s) - start )) s"
