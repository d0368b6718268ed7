#!/bin/bash
# Run BJ: step plans and plans for a new shape on the device. First the CUDA backend
# tests; then A/B replays through the CUDA backend at 60%, reactive against
# predictive, with the default and with one switch off, one after the other (which goes
# first alternates by trace; reactive tiers make neither kind of plan, so their two
# replays show the device's spread), with scripts/tier_replays_gpu.sh:
# - AB=steps: --no-step-plans on the generation traces (GPT-2 medium generation of the
#   train split, Llama generation of the test split, the OPT- and Pythia-style
#   held-out generation families);
# - AB=shapes: --no-new-shape-plans on the dynamic traces where the sim moved most
#   (GPT-2 with a batch drawn per iteration, bundled; of the test split GraphSAGE,
#   the Llama with a batch drawn per iteration on two streams, wav2vec 2.0, the LoRA
#   Llama with sequence lengths drawn, and Faster R-CNN, where the sim put it higher).
# Every replay's JSON in $OUT/ab-$AB/tier-replays.jsonl with its arguments.
# Calls on one warm machine (a call may run 10 minutes): `TESTS=1 AB=steps LIMIT=...`,
# then `TESTS=0 AB=shapes`, then further rounds with ORDER=rev.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root.
# Ran on an H100 80GB HBM3 (the device given) at commit cc3a22c, four calls on one
# warm machine: `TESTS=1 AB=steps LIMIT=250` (330 s), `TESTS=0 AB=shapes LIMIT=420`
# (156 s), `TESTS=0 AB=steps ORDER=rev LIMIT=420` (230 s), `TESTS=0 AB=shapes
# ORDER=rev LIMIT=420` (168 s): runBJ-cuda-tests.log (18 of 18), runBJ-steps.jsonl
# and runBJ-shapes.jsonl (two rounds each, every replay completed, no out-of-memory
# error). Means of the two rounds, predictive with -> without the switch:
# step plans: GPT-2 medium generation 0.0407 -> 0.0311, Llama generation 0.0004 ->
# 0.0005, OPT-350m-style 0.0550 -> 0.0530, Pythia-410m-style 0.0132 -> 0.0164 (mean
# 0.0273 -> 0.0253; reactive, which makes no step plan, 0.1300 -> 0.1345);
# plans for a new shape: GPT-2 with a batch drawn 0.4682 -> 0.5191, GraphSAGE 4.0530
# -> 4.2646, wav2vec 2.0 0.6575 -> 0.6958, Llama with a batch drawn 0.7066 -> 0.6856,
# LoRA Llama with sequence lengths drawn 0.5705 -> 0.5374, Faster R-CNN 0.4721 ->
# 0.4718 (mean 1.1547 -> 1.1957; reactive 1.2856 -> 1.2916).
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
ab=${AB:-steps}
if [ "$ab" = steps ]; then
  args=--no-step-plans
  list="corpus/train/gpt2_medium_generate_dynamic corpus/test/llama_generate_dynamic
        corpus/generation/opt_350m_generate_dynamic corpus/generation/pythia_410m_generate_dynamic"
else
  args=--no-new-shape-plans
  list="traces/gpt2_dynbatch_s512_train_bf16 corpus/test/sage_dyngraph
        corpus/test/llama_dynbatch_s512_2stream corpus/test/wav2vec2_dynlen_b8
        corpus/test/llama_lora_dynseq_sgd corpus/test/fasterrcnn_mnv3_b8"
fi
m=$root/training-data/runBJ-$ab.tsv
{
  printf 'file\tworkload\tfamily\tshapes\tsplit\tdescription\n'
  for f in $list; do printf '%s.mctrace\t%s\t-\tdynamic\tab\t-\n' "$f" "$(basename $f)"; done
} > $m.fwd
if [ "${ORDER:-fwd}" = rev ]; then { head -1 $m.fwd; tail -n +2 $m.fwd | tac; } > $m; else cp $m.fwd $m; fi
MEMCAST_AB_ARGS=$args "$here/tier_replays_gpu.sh" $OUT/ab-$ab $m ab 0.6 ${LIMIT:-300}
echo "total $(( $(date +%s) - start )) s"
