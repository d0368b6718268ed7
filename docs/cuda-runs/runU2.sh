#!/bin/bash
# Second call of run U: where the plans stop serving live (BERT and GPT-2 under
# page_release:peak,placement:planned, recording what memcast sees, for replay on the
# simulator), and the host cost of planned placement alone (Mixtral: default,
# placement:planned, and the pair with page_release:peak, alternated twice).
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/lib
export MEMCAST_TORCH_LIB=$PWD/libmemcast_torch.so PYTHONPATH=$PWD/python MEMCAST_REQUIRE_GPU=1
mkdir -p /tmp/w $OUT/live
show() {
python3 - "$1" <<'PY'
import json, sys
try:
    f = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no figures:", e); sys.exit(0)
it = f["iteration_s"]; half = sorted(it[len(it) // 2:])
print(f"  overhead {f['reserved_overhead']*100:.2f}%  median iteration {f['median_iteration_s']*1e3:.0f} ms, last half {half[len(half)//2]*1e3:.0f} ms  pages moved {f['pages_moved_per_iteration']}")
print("  iteration ms", [round(x * 1e3) for x in it])
print("  placement", json.dumps(f.get("placement")))
PY
}
for w in bert_b16_s512_bf16_adamw gpt2_b16_s512_bf16_ckpt; do
  MEMCAST_ALLOC_CONF=page_release:peak,placement:planned timeout 110 python3 corpus/record.py --workload $w --mode memcast --tag planned --iters 12 --memcast-trace $OUT/live/$w.mctrace --out /tmp/w > /tmp/w/$w.log 2>&1; echo "$w planned exit $?"
  show /tmp/w/$w.memcast-planned.json
done
for round in 1 2; do
  for c in default: bestfit_planned:placement:planned planned:page_release:peak,placement:planned; do
    tag=${c%%:*}; conf=${c#*:}
    MEMCAST_ALLOC_CONF=$conf timeout 110 python3 corpus/record.py --workload mixtral_b8_s512_bf16 --mode memcast --tag $tag-$round --iters 16 --out /tmp/w > /tmp/w/mixtral.$tag.$round.log 2>&1; echo "mixtral $tag round $round exit $?"
    show /tmp/w/mixtral_b8_s512_bf16.memcast-$tag-$round.json
  done
done
cat /tmp/w/*.json > $OUT/runU2.jsonl
ls -la $OUT/live
