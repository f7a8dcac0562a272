#!/bin/sh
# Text in and text out with one binary: `shardtrain tokenize` writes GPT-2 tokens of the GPL texts (a JSONL document a
# paragraph, a tenth for validation), a small GPT-2-vocabulary model trains on them with data.tokenizer set and
# prints its end-of-run sample as text, and `shardtrain generate` continues a text prompt from its checkpoint, the
# same text for the same seed and another for another seed.
#   text_roundtrip_test.sh SHARDTRAIN TOKENIZER.json WORKDIR
set -eu
st=$1 tok=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
/usr/bin/python3 - "$work/docs.jsonl" <<'PY'
import json, sys
text = open("/usr/share/common-licenses/GPL-3").read() + open("/usr/share/common-licenses/GPL-2").read()
with open(sys.argv[1], "w") as f:
    for p in text.split("\n\n"):
        if p.strip():
            f.write(json.dumps({"text": p}) + "\n")
PY
"$st" tokenize --tokenizer "$tok" --out "$work/tok/gpl" --val-fraction 0.1 --threads 2 "$work/docs.jsonl"
out=$("$st" train --config "$(dirname "$0")/../../configs/tiny.ini" --model.vocab_size=50257 --model.n_layer=2 \
  --model.n_embd=64 --model.n_head=2 --model.seq_len=64 --data.format=llmc --data.path="$work/tok/gpl_train_*.bin" \
  --data.val_path="$work/tok/gpl_val_*.bin" --data.tokenizer="$tok" --train.steps=10 --train.global_batch=4 --train.micro_batch=4 --train.eval_every=0 \
  --train.sample_tokens=12 --ckpt.dir="$work/ckpt" 2>&1)
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q '^sample (prompt: the first 16 tokens of the validation data):$' ||
  { echo "FAIL: no text sample"; exit 1; }
sample=$(printf '%s\n' "$out" | sed -n '/^sample (prompt/{n;p;}')
case $sample in
  "<|endoftext|>"*) ;;  # the validation stream starts with a document separator
  *) echo "FAIL: the sample does not start with the first validation document's separator: $sample"; exit 1 ;;
esac
ckpt=$(ls -d "$work"/ckpt/step_* | tail -1)
a=$("$st" generate --ckpt "$ckpt" --prompt "the GNU General Public License" --max-tokens 10 --seed 7 2>/dev/null)
b=$("$st" generate --ckpt "$ckpt" --tokenizer "$tok" --prompt "the GNU General Public License" --max-tokens 10 \
  --seed 7 2>/dev/null)
echo "generate: $a"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: generate gave '$a' and '$b' for one seed"; exit 1; }
c=$("$st" generate --ckpt "$ckpt" --prompt "the GNU General Public License" --max-tokens 10 --seed 8 2>/dev/null)
[ "$c" != "$a" ] || { echo "FAIL: seeds 7 and 8 gave the same text: $a"; exit 1; }
echo "OK"
