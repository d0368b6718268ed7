#!/bin/bash
# Run AQ: two generation workloads of decoder families the corpus does not hold (OPT,
# GPT-NeoX), recorded as the corpus is (scripts/corpus/record.py, native mode, memory
# history) and imported; they check "Past the previous iteration's end" on generation
# it was not chosen on. Staged with scripts/stage-gpu.sh .gpu; traces in $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/g
for w in opt_350m_generate_dynamic pythia_410m_generate_dynamic; do
  (timeout 240 python3 scripts/corpus/record.py --workload $w --mode native --out /tmp/g > /tmp/g/$w.log 2>&1
   echo "$w record exit $? at $(( $(date +%s) - start )) s"; tail -2 /tmp/g/$w.log
   .gpu/memcast trace import /tmp/g/$w.snapshot.pickle -o $OUT/$w.mctrace; echo "$w import exit $?") &
done
wait
cat /tmp/g/*.native.json > $OUT/runAQ-native-figures.jsonl 2>/dev/null
echo "total $(( $(date +%s) - start )) s"
