#!/bin/bash
# Run AP: the GPU suite's PyTorch part at this session's final code (the prefetcher's
# predicted reads past the previous iteration's end, which no GPU path uses, and run
# AN's forecaster): the memcast_torch library tests, the Python tests, and
# `memcast replay --device cuda` on the two bundled traces gpu-tests.sh replays.
# Staged with scripts/stage-gpu.sh .gpu; logs in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
export MEMCAST_TORCH_LIB=$PWD/.gpu/libmemcast_torch.so MEMCAST_REQUIRE_GPU=1 MEMCAST_BIN=$PWD/.gpu/memcast
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
.gpu/torch-tests --test-threads=1 > $OUT/runAP-torch-tests.log 2>&1; echo "torch lib tests exit $?"
tail -1 $OUT/runAP-torch-tests.log
(cd .gpu/python && timeout 420 python3 -m pytest -q -p no:cacheprovider tests) > $OUT/runAP-python-tests.log 2>&1
echo "python tests exit $? at $(( $(date +%s) - start )) s"; tail -2 $OUT/runAP-python-tests.log
for t in resnet50_b64_train gpt2_b8_s1024_train_bf16; do
  .gpu/memcast replay .gpu/traces/$t.mctrace --device cuda --json > $OUT/runAP-replay-cuda-$t.json 2>&1
  echo "replay --device cuda $t exit $?"
done
echo "total $(( $(date +%s) - start )) s"
