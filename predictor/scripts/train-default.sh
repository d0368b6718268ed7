#!/usr/bin/env bash
# Reproduces the shipped default model: the bundled real traces plus a seeded synthetic
# set (seed 1), default configuration (seed 42). Usage: predictor/scripts/train-default.sh [MEMCAST]
set -euo pipefail
BIN=${1:-target/debug/memcast}
SYN=$(mktemp -d)
trap 'rm -rf "$SYN"' EXIT
"$(dirname "$0")/synth-set.sh" "$BIN" "$SYN" 1
time "$BIN" train --traces training-data/traces "$SYN" -o training-data/models/default
