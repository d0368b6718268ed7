#!/bin/bash
# Run BH: spill hysteresis on the device, A/B in one run, at commit 6e1a162, where it
# was on by default and `--no-spill-hysteresis` turned it off (off by default again
# since, and the switch is `--spill-hysteresis`: docs/tiers.md, "Spill hysteresis"; in
# runBH-ab.jsonl `args: ""` is with it): test traces of the held-out
# split replayed through the CUDA backend at 60%, reactive against predictive, each
# with the default (spill hysteresis on) and with --no-spill-hysteresis, one after the
# other, until LIMIT seconds have passed (the traces where runs BC and BF differed most
# first). Every replay's JSON in $OUT/ab.jsonl with its arguments.
# Staged with scripts/stage-gpu.sh .gpu; this script copied into .gpu; run from the
# repository root. Ran on an H100 80GB HBM3 at commit 6e1a162 with LIMIT=250 in 232 s:
# the 12 traces listed, each once either way (runBH-ab.jsonl). Means of the 12, without
# -> with: reactive 1.3438 -> 1.3611, predictive 0.8101 -> 0.8272; lower on 6 and
# higher on 6 for each policy.
set -u
root=$PWD
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$here/lib:${LD_LIBRARY_PATH:-}
limit=${LIMIT:-280}
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
for t in conformer_b16_1024f_bf16 vit_b16_b128_ckpt_bf16 gat_dyngraph llama_lora_b8_s1024_bf16 \
    llama_b16_s1024_ckpt_bf16 vit_b16_b64_bf16_adamw unet_b64_64px_adamw llama_dynbatch_s512_2stream \
    swin_t_b64_2stream_bf16 mixtral_b8_s512_bf16 qwen2moe_b8_s512_bf16 unet_b16_128px_bf16_ckpt; do
  for args in "" "--no-spill-hysteresis"; do
    [ $(( $(date +%s) - start )) -gt "$limit" ] && { echo "out of time before $t $args"; break 2; }
    json=$(timeout 60 "$here/memcast" replay "$root/training-data/corpus/test/$t.mctrace" --device cuda \
      --compare reactive,predictive --budget 0.6 $args --json 2>>$OUT/ab.err)
    echo "$json" | python3 -c '
import json, sys
t, args, out = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.load(sys.stdin)
except ValueError:
    print(t, args, "no JSON"); sys.exit()
open(out, "a").write(json.dumps({"trace": t, "args": args, "replays": d}) + "\n")
print("%-28s %-22s reactive %.4f predictive %.4f" % (t, args or "default", d["reactive"]["stall_overhead"], d["predictive"]["stall_overhead"]))
' "$t" "$args" $OUT/ab.jsonl
  done
done
echo "total $(( $(date +%s) - start )) s"
