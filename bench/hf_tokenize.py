"""Hugging Face tokenizers' batch encode (the Rust library through its Python package, all cores through its own
thread pool) over a JSONL file's "text" fields: the peer of `shardtrain tokenize` in bench/tokenize_throughput.sh
where Python's `tokenizers` is installed. Prints one JSON line, as bench/hf_tokenize.js does.

    python3 bench/hf_tokenize.py TOKENIZER.json DOCS.jsonl [BATCH_DOCS]
"""
import json
import sys
import time

from tokenizers import Tokenizer


def main():
    tok_path, docs_path = sys.argv[1], sys.argv[2]
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    t0 = time.perf_counter()
    with open(docs_path, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f if line.strip()]
    t1 = time.perf_counter()
    tok = Tokenizer.from_file(tok_path)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    t2 = time.perf_counter()
    tokens = 0
    for i in range(0, len(docs), batch):
        for e in tok.encode_batch(docs[i:i + batch], add_special_tokens=False):
            tokens += len(e.ids)
    t3 = time.perf_counter()
    print(json.dumps({"documents": len(docs), "bytes": nbytes, "tokens": tokens, "read_parse_s": t1 - t0,
                      "encode_s": t3 - t2, "mb_per_s": nbytes / (t3 - t2) / 1e6}))


if __name__ == "__main__":
    main()
