#!/bin/bash
# Run BC: the two held-out traces on which predictive tiers stalled more than reactive
# in run BA (llama_b8_s1024_bf16_adamw 1.44 -> 1.49, gcn_fixed_200k 18.02 -> 19.40),
# replayed again at 60% on one machine, rounds in alternating order, to tell the
# device's spread from the policies' difference. Same code as run BB (staged with
# scripts/stage-gpu.sh .gpu, this script copied into .gpu, run from the repository root).
# The manifest of the two traces was made with:
#   m=training-data/corpus/manifest.tsv; r=training-data/corpus/runBC.tsv; head -1 $m > $r
#   grep -P '^test/(llama_b8_s1024_bf16_adamw|gcn_fixed_200k).mctrace\t' $m >> $r
set -u
here="$(cd "$(dirname "$0")" && pwd)"
r=training-data/corpus/runBC.tsv
for i in 1 2; do
  "$here/tier_replays_gpu.sh" $OUT/bc$i $r test 0.6 70
done
