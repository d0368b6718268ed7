#!/bin/bash
# Run BD: the memcast_torch library tests and the Python tests of memcast_torch on the
# GPU, the parts of scripts/gpu-tests.sh that run BC did not run (it ran the CUDA
# backend tests, from the same staged build, commit 71a9320): the first run of them since
# memcast-torch applies successive configure() strings in turn and its host pool takes
# one range of the staging pool; then the device replays of gpu-tests.sh (ResNet-50 and
# GPT-2, costs picked by the GPU's name).
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root; logs in $OUT. Ran on an H100 80GB HBM3: every test passed (8 Rust, 52
# Python); runBD-tests.log.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1 MEMCAST_CUDA_REPORT=$OUT/cuda-figures.jsonl
export MEMCAST_TORCH_LIB="$here/libmemcast_torch.so" MEMCAST_BIN="$here/memcast"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
timeout 60 "$here/torch-tests" --test-threads=1 > $OUT/rust-torch-tests.log 2>&1
echo "torch-tests exit $? after $(( $(date +%s) - start )) s"
grep -E "test result|panicked|FAILED" $OUT/rust-torch-tests.log | head
(cd "$here/python" && timeout 330 python3 -m pytest -q -p no:cacheprovider tests) > $OUT/python-tests.log 2>&1
echo "python tests exit $? after $(( $(date +%s) - start )) s"
tail -5 $OUT/python-tests.log
for t in resnet50_b64_train gpt2_b8_s1024_train_bf16; do
  timeout 40 "$here/memcast" replay "$here/traces/$t.mctrace" --device cuda --json > $OUT/replay-cuda-$t.json 2>$OUT/replay-cuda-$t.err
  echo "$t replay exit $?"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ", r.get("gpu"), r.get("costs"), "overhead %.4f" % r["reserved_overhead"], "device allocs", r["device_allocs"])' $OUT/replay-cuda-$t.json
done
echo "total $(( $(date +%s) - start )) s"
