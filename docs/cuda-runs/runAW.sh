#!/bin/bash
# Run AW: the device's breakdown of the held-out split's tiered replays at 60%, reactive
# against predictive (run AU's per-trace files did not all come back): GraphSAGE alone
# first (the trace whose device stall was a third of the sim's), then the whole test
# split, with scripts/tier_replays_gpu.sh, which keeps every replay's JSON in one file.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root (the traces are the checkout's); figures in $OUT.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
m=$root/training-data/corpus/manifest.tsv
one=$root/training-data/corpus/runAW-sage.tsv
head -1 $m > $one
grep -P '^test/sage_dyngraph.mctrace\t' $m >> $one
"$here/tier_replays_gpu.sh" $OUT/sage $one test 0.6 0
"$here/tier_replays_gpu.sh" $OUT/split $m test 0.6 430
