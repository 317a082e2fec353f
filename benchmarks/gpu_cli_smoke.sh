#!/usr/bin/env bash
# Every user-facing command once on this machine's default device (CUDA where one is present).
# generate (dspark, k-mer, native, fp32/bf16, with and without graphs), verify, score, train,
# distill, generate with the new drafter, bench. One line per command in $OUT/cli_rc.txt, all
# output (stats tables, verify report, bench report included) in $OUT/cli.log. Where biopython is missing (the device machine), benchmarks/device_shim
# stands in for it. ~1.5 min on the 2-core CPU.
OUT=${OUT:-/tmp/cli-out}; W=${W:-/tmp/evs_w}; mkdir -p "$OUT"; rm -rf "$W"; mkdir -p "$W"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import Bio" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks/device_shim
X="python3 -c 'from evspark_cli.cli import main; main()'"
run() { local name=$1 t=$2; shift 2; echo "=== $name: $*" >>"$OUT/cli.log"; local s=$(date +%s%N)
  timeout "$t" bash -c "$*" >>"$OUT/cli.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( ($(date +%s%N) - s) / 1000000 ))ms" | tee -a "$OUT/cli_rc.txt"; }
python3 - "$W" <<'PY'  # a random 200 kb genome, a phiX-sized validation file, a tiny model config
import json, random, sys
w = sys.argv[1]
rng = random.Random(0)
for name, n in (("train", 200_000), ("valid", 5_386)):
    seq = "".join(rng.choice("ACGT") for _ in range(n))
    with open(f"{w}/{name}.fa", "w") as f:
        f.write(f">{name}\n" + "\n".join(seq[i:i + 60] for i in range(0, n, 60)) + "\n")
cfg = json.load(open("models/evspark-sh2-192/train_config.json"))
cfg["model"].update(model_name="tiny", hidden_size=64, num_layers=4, num_attention_heads=2,
                    inner_mlp_size=128, hcs_filter_groups=8, hcm_filter_groups=8,
                    hcs_layer_idxs=[0], hcm_layer_idxs=[1], hcl_layer_idxs=[2], attn_layer_idxs=[3],
                    hidden_layers=[1, 3])
cfg.update(out_dir=f"{w}/train", train=[f"{w}/train.fa"], valid=[f"{w}/valid.fa"], window=512,
           steps=30, warmup=5, eval_every=15, eval_tokens=2048, eval_context=512, ckpt_every=10)
json.dump(cfg, open(f"{w}/train.json", "w"), indent=1)
PY
run info 60 "$X info"
run generate_dspark 60 "$X generate examples/prompts.fa -n 256 --compare-native -o $W/g.fa --stats $W/g.tsv -q && cat $W/g.tsv"
run generate_greedy_fp32 60 "$X generate examples/prompts.fa -n 128 --greedy --dtype float32 --drafter kmer -o $W/k.fa -q"
run generate_native_nographs 60 "$X generate examples/prompts.fa -n 64 --drafter none --no-cuda-graphs -o $W/n.fa -q"
run verify 60 "$X verify examples/prompts.fa -n 256 --report $W/v.json"
run verify_fp32_replay 60 "$X verify examples/prompts.fa -n 256 --dtype float32 --rollback replay"
run score 60 "$X score examples/prompts.fa $W/valid.fa -o $W/s.tsv --logits $W/s.safetensors && cat $W/s.tsv"
run train 90 "$X train --config $W/train.json -q && ls $W/train"
run distill 90 "$X distill --train $W/train.fa --steps 20 --batch 8 --natural-windows 8 --onpolicy-windows 4 --window 512 --output $W/drafter -q && ls $W/drafter"
run generate_new_drafter 60 "$X generate examples/prompts.fa -n 128 --drafter $W/drafter -o $W/d.fa --stats $W/d.tsv -q && cat $W/d.tsv"
run bench 100 "$X bench --prompts examples/prompts.fa --n-prompts 3 -n 128 --seeds 0 --baselines kmer,identity --rollbacks slice,replay --skip gamma,context,depth -o $W/bench -q"
# two files only ($OUT comes back from the device machine, at most 8 files in all): the small
# outputs go into the log
for f in "$W"/v.json "$W"/bench/report.md; do [ -f "$f" ] && { echo "=== $f"; cat "$f"; } >>"$OUT/cli.log"; done
! grep -q "rc=[1-9]" "$OUT/cli_rc.txt"
