#!/usr/bin/env bash
# Generates a set of seeded dynamic synthetic traces (memcast_trace::synth) for training
# or testing the forecaster. Usage: predictor/scripts/synth-set.sh MEMCAST OUTDIR SEED
# The default model trains on SEED=1; the held-out test set uses SEED=1000.
set -euo pipefail
BIN=$1; OUT=$2; S=$3
mkdir -p "$OUT"
g() { "$BIN" trace gen "$@" >/dev/null; }
g --family transformer --mode generate --iterations 8 --seed $S --gen-batches 1,4,8,16 --gen-prompts 32,128,384 --gen-new-tokens 16,32,64 --depth 6 -o "$OUT/gen_$S.mctrace"
g --family bert --iterations 12 --seed $((S+1)) --dynamic seq --values 64,128,256,512 --depth 4 -o "$OUT/bert_dynseq_$S.mctrace"
g --family cnn --iterations 12 --seed $((S+2)) --dynamic image --values 128,160,192,224,256 --depth 50 --batch 16 -o "$OUT/cnn_dynimage_$S.mctrace"
g --family transformer --iterations 12 --seed $((S+3)) --dynamic batch --values 2,4,8,12 --depth 6 --seq 512 -o "$OUT/gpt_dynbatch_$S.mctrace"
g --family transformer --iterations 12 --seed $((S+4)) --dynamic seq --values 128,256,512,1024 --depth 4 --batch 4 -o "$OUT/gpt_dynseq_$S.mctrace"
g --family mlp --iterations 12 --seed $((S+5)) --dynamic batch --values 32,64,128,256,512 --depth 8 -o "$OUT/mlp_dynbatch_$S.mctrace"
g --family mobilenet --iterations 12 --seed $((S+6)) --dynamic batch --values 16,32,64 -o "$OUT/mobilenet_dynbatch_$S.mctrace"
