#!/bin/bash
# Run BJ: step plans and the plan guard's rule on the device. First the CUDA backend
# tests, then the generation traces (GPT-2 medium generation of the train split, Llama
# generation of the test split, the OPT- and Pythia-style held-out generation families)
# replayed through the CUDA backend at 60%, reactive against predictive, with the
# default and with --no-step-plans one after the other (which goes first alternates by
# trace; reactive tiers make no step plans, so their two replays show the device's
# spread), with scripts/tier_replays_gpu.sh; every replay's JSON in
# $OUT/ab/tier-replays.jsonl with its arguments.
# Calls on one warm machine (a call may run 10 minutes): `TESTS=1 ORDER=fwd LIMIT=...`,
# then `TESTS=0 ORDER=rev` for a second round in the reverse order.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
export MEMCAST_REQUIRE_GPU=1
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 "$here/cuda-tests" --include-ignored --test-threads=1 > $OUT/cuda-tests.log 2>&1
  echo "cuda-tests exit $? after $(( $(date +%s) - start )) s"
  grep -E "test result|panicked|FAILED" $OUT/cuda-tests.log | head -20
fi
m=$root/training-data/corpus/runBJ.tsv
{
  printf 'file\tworkload\tfamily\tshapes\tsplit\tdescription\n'
  for f in train/gpt2_medium_generate_dynamic test/llama_generate_dynamic \
           generation/opt_350m_generate_dynamic generation/pythia_410m_generate_dynamic; do
    printf '%s.mctrace\t%s\t-\tdynamic\tgen\t-\n' "$f" "$(basename $f)"
  done
} > $m.fwd
if [ "${ORDER:-fwd}" = rev ]; then { head -1 $m.fwd; tail -n +2 $m.fwd | tac; } > $m; else cp $m.fwd $m; fi
MEMCAST_AB_ARGS=--no-step-plans "$here/tier_replays_gpu.sh" $OUT/ab $m gen 0.6 ${LIMIT:-300}
echo "total $(( $(date +%s) - start )) s"
