"""What the checks against Hugging Face (transformers_check.py, peft_check.py) share: running the binary, and
writing a token stream in llm.c's format."""
import subprocess
import sys

import numpy as np


def run(cmd):
    """Runs cmd; on a non-zero exit prints it with its output and exits the check."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(" ".join(cmd) + "\n" + r.stdout)
        sys.exit(f"exit code {r.returncode}")
    return r.stdout


def write_tokens(path, tokens):
    """An llm.c token file (uint16 tokens after a 256-int header)."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())
