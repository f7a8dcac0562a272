#!/bin/sh
# shardtrain tokenize on two text files (two documents) into 1000-token shards: the summary line, the shard files,
# and their token count, which the summary states.
#   tokenize_summary_test.sh SHARDTRAIN TOKENIZER.json WORKDIR
set -eu
st=$1 tok=$2 work=$3
rm -rf "$work" && mkdir -p "$work/in"
cp /usr/share/common-licenses/GPL-3 "$work/in/a.txt"
cp /usr/share/common-licenses/GPL-2 "$work/in/b.txt"
out=$("$st" tokenize --tokenizer "$tok" --out "$work/out/d" --shard-tokens 1000 --threads 2 "$work/in/*.txt")
printf '%s\n' "$out"
line=$(printf '%s\n' "$out" | head -1)
printf '%s\n' "$line" | grep -Eq '^tokenize: 2 documents \(0 for validation\), [0-9]+ tokens from [0-9.]+ kB in' ||
  { echo "FAIL: summary line"; exit 1; }
tokens=$(printf '%s\n' "$line" | sed -E 's/.*, ([0-9]+) tokens from.*/\1/')
shards=$(ls "$work/out" | grep -c '^d_train_.*\.bin$')
[ "$shards" -eq $(( (tokens + 999) / 1000 )) ] || { echo "FAIL: $shards shards for $tokens tokens"; exit 1; }
bytes=0
for f in "$work"/out/d_train_*.bin; do bytes=$((bytes + $(stat -c %s "$f") - 1024)); done
[ "$bytes" -eq $((2 * tokens)) ] || { echo "FAIL: $bytes token bytes for $tokens uint16 tokens"; exit 1; }
[ ! -e "$work/out/d_val_000000.bin" ] || { echo "FAIL: a validation shard without --val-fraction"; exit 1; }
echo "OK: $tokens tokens in $shards shards"
