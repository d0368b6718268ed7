#!/bin/bash
# The wall time of each test-split workload's iterations run alone on the GPU, with
# nothing recorded (scripts/corpus/time_iterations.py), into $OUT/solo-times.jsonl.
set -u
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
start=$(date +%s)
python3 scripts/corpus/time_iterations.py --split test --deadline-s 330 > $OUT/solo-times.jsonl
wc -l $OUT/solo-times.jsonl
echo "total $(( $(date +%s) - start )) s"
