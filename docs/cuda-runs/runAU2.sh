#!/bin/bash
# Run AU2: run AU's second round where it ran out of time (the test traces after
# swin_v2_t_multiscale_b32 in reverse order), GraphSAGE first (twice), every replay's
# whole JSON kept in one file ($OUT/runAU2.jsonl: run AU's per-file outputs did not all
# come back). Same command: `memcast replay T --device cuda --compare
# reactive,predictive --budget 0.6 --json`. Staged with scripts/stage-gpu.sh .gpu; this
# script copied into .gpu; run from the repository root.
set -u
root=$PWD
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
start=$(date +%s)
order="sage_dyngraph sage_dyngraph swin_t_b64_adamw swin_t_b64_2stream_bf16 retinanet_r50_b4 qwen2moe_b8_s512_bf16 mixtral_dynseq_b4_bf16 mixtral_b8_s512_bf16 llama_lora_dynseq_sgd llama_lora_b8_s1024_bf16 llama_dynseq_b8_bf16 llama_dynbatch_s512_2stream llama_b8_s1024_bf16_adamw llama_b16_s1024_ckpt_bf16 gat_dyngraph fasterrcnn_mnv3_b8 deit_small_b128_sgd conformer_b16_1024f_bf16"
for t in $order; do
  if [ $(( $(date +%s) - start )) -gt 230 ]; then echo "out of time before $t"; break; fi
  o=$(timeout 60 ./memcast replay $root/training-data/corpus/test/$t.mctrace --device cuda --compare reactive,predictive --budget 0.6 --json 2>/dev/null)
  echo "$o" | python3 -c "
import json,sys
d=json.load(sys.stdin); d['trace']='$t'; print(json.dumps(d))" >> $OUT/runAU2.jsonl
  echo "$o" | python3 -c "
import json,sys
d=json.load(sys.stdin)
for k,v in d.items():
    print('%-28s %-10s stall=%.4f blocked=%.0fms faults=%s fault=%.0fms oom_wait_out=%.0fms oom_spill=%.0fms late=%.0fms hit=%.3f wall=%.1fs' % ('$t', k, v['stall_overhead'], v['stall_us']/1e3, v['faults'], v['fault_us']/1e3, v['oom_wait_out_us']/1e3, v['oom_spill_us']/1e3, v['late_prefetch_us']/1e3, v['prefetch_hit_rate'], v['wall_secs']))"
done
echo "total $(( $(date +%s) - start )) s"
