#!/usr/bin/env bash
# `shardtrain generate` as a Unix filter, through real pipes and signals: it prints each token as it is decoded, stops
# at once with exit 0 when its stdout is closed (`| head -c 100`), and on SIGINT or SIGTERM stops decoding, keeps what
# it printed (ending the line) and exits 130 or 143 with one line on stderr; under mpirun every rank stops at the same
# token. A batch (--prompts) does the same a result line at a time. The signal comes at a known token through SHARDTRAIN_FAULT (sigint or sigterm:RANK@TOKEN), not a timer, and
# every run asks for 100 million tokens: one that does not stop runs into the deadline of each wait (a fixed code
# stops within a second).
#
#   generate_stream.sh CASE SHARDTRAIN CONFIG WORKDIR
#   CASE: setup (trains the checkpoint the other cases read, in WORKDIR/ckpt) | pipe_ids | pipe_text | sigint_ids |
#         sigterm_text | sigint_mpi | pipe_lines | sigint_lines
#
# Exit 0: the case passed; 77: skipped (the reason is printed); anything else: failed.
set -u
if [[ $# -ne 4 ]]; then
  echo "usage: $0 CASE SHARDTRAIN CONFIG WORKDIR" >&2
  exit 2
fi
case_name=$1 bin=$2 config=$3 work=$4
step=$work/ckpt/step_00000020
fail() {
  echo "generate_stream $case_name: FAIL: $*" >&2
  exit 1
}
many=100000000
# A run that ignores its stop would decode for hours: 60 s is the deadline of every run below.
bounded() { timeout 60 "$@"; }
# Sampled with a fixed seed: every run draws the same tokens, and they vary more than the greedy ones of a model this
# small.
sampling="--temperature 0.8 --seed 5"

# The first $2 tokens of a run from prompt arguments $1 (word-split), as printed by a run of exactly that many.
reference() {
  # shellcheck disable=SC2086
  bounded "$bin" generate --ckpt "$step" $1 --max-tokens "$2" $sampling 2>"$work/$case_name.ref.err" ||
    fail "the reference run of $2 tokens failed: $(cat "$work/$case_name.ref.err")"
}

# A pipe closed by its reader: generate exits 0 at once, and what the reader took is the start of the text.
closed_pipe() {
  local prompt=$1 out=$work/$case_name.out err=$work/$case_name.err
  local start=$SECONDS
  # shellcheck disable=SC2086
  bounded "$bin" generate --ckpt "$step" $prompt --max-tokens $many $sampling 2>"$err" | head -c 100 >"$out"
  local rc=${PIPESTATUS[0]}
  ((rc == 0)) || fail "generate exited $rc after its reader closed the pipe, expected 0 (124: still decoding at 60 s)"
  (($(wc -c <"$out") == 100)) || fail "head read $(wc -c <"$out") bytes, expected 100"
  ((SECONDS - start < 30)) || fail "generate took $((SECONDS - start)) s to stop after its reader left"
  grep -q '^generate: .*stdout was closed after [0-9]* tokens' "$err" ||
    fail "no summary saying stdout was closed: $(cat "$err")"
  # The same bytes a run of 200 tokens starts with.
  cmp -s "$out" <(reference "$prompt" 200 | head -c 100) || fail "the 100 bytes are not the text's start: $(cat "$out")"
}

# SIGNAL raised by rank RANK once it has sampled token 7 (under LAUNCH, e.g. mpirun): exit 128 + the signal number,
# exactly the first 7 tokens printed and the line ended, one line on stderr naming the signal.
stopped_at_7() {
  local signal=$1 prompt=$2 rank=$3 code=$4 launch=${5:-} out=$work/$case_name.out err=$work/$case_name.err
  local fault
  fault=sig$(tr "[:upper:]" "[:lower:]" <<<"$signal"):$rank@7
  # shellcheck disable=SC2086
  SHARDTRAIN_FAULT=$fault bounded $launch "$bin" generate --ckpt "$step" $prompt --max-tokens $many $sampling \
    >"$out" 2>"$err"
  local rc=$?
  ((rc == code)) || fail "exit $rc, expected $code (124: still decoding at 60 s); stderr: $(cat "$err")"
  cmp -s "$out" <(reference "$prompt" 7) || fail "stdout is not the 7 tokens before the signal: $(od -c "$out" | head)"
  local line="generate: stopped by SIG$signal after 7 of $many tokens; the text printed so far is kept (exit $code)"
  if [[ -z $launch ]]; then
    # Beside the log's "I [host] checkpoint: loaded ..." line, stderr holds that line alone.
    [[ $(grep -v -E '^I \[.*\] checkpoint: loaded ' "$err") == "$line" ]] ||
      fail "stderr is not the one line saying so: $(cat "$err")"
  else
    # mpirun adds its own report of the exit code: the line must be there once, from rank 0.
    (($(grep -c -x -F "$line" "$err") == 1)) || fail "stderr does not say so once: $(cat "$err")"
  fi
}

# A batch (--prompts) whose reader leaves after 2 result lines: generate exits 0 long before the 400 results, and the
# reader took the 2 lines a run of those 2 prompts prints.
closed_pipe_lines() {
  local out=$work/$case_name.out err=$work/$case_name.err prompts=$work/$case_name.prompts
  for ((k = 0; k < 200; ++k)); do printf 'The \nOnce upon\n'; done >"$prompts"
  printf 'The \nOnce upon\n' >"$prompts.2"
  local start=$SECONDS
  bounded "$bin" generate --ckpt "$step" --prompts "$prompts" --max-tokens 100 $sampling 2>"$err" | head -n 2 >"$out"
  local rc=${PIPESTATUS[0]}
  ((rc == 0)) || fail "generate exited $rc after its reader closed the pipe, expected 0 (124: still decoding at 60 s)"
  ((SECONDS - start < 30)) || fail "generate took $((SECONDS - start)) s to stop after its reader left"
  # The closed pipe shows at the next write: within the first --batch (16) prompts decoded together, or soon after.
  grep -q -E '^generate: .*, 400 prompts; stdout was closed after [0-9]{1,2} results; the load: ' "$err" ||
    fail "no summary saying stdout was closed after a few results: $(cat "$err")"
  # shellcheck disable=SC2086
  cmp -s "$out" <(bounded "$bin" generate --ckpt "$step" --prompts "$prompts.2" --max-tokens 100 $sampling 2>/dev/null) ||
    fail "the 2 lines are not the first 2 results: $(cat "$out")"
}

# SIGINT on the last token of the first of 3 results (--max-tokens 7, the signal at token 7): exit 130, that result
# printed (the first line of a whole run), the others not, and one line on stderr saying so.
stopped_lines() {
  local out=$work/$case_name.out err=$work/$case_name.err prompts=$work/$case_name.prompts
  printf 'The \nOnce upon\nA\n' >"$prompts"
  SHARDTRAIN_FAULT=sigint:0@7 bounded "$bin" generate --ckpt "$step" --prompts "$prompts" --max-tokens 7 \
    $sampling >"$out" 2>"$err"
  local rc=$?
  ((rc == 130)) || fail "exit $rc, expected 130; stderr: $(cat "$err")"
  # shellcheck disable=SC2086
  cmp -s "$out" <(bounded "$bin" generate --ckpt "$step" --prompts "$prompts" --max-tokens 7 $sampling 2>/dev/null |
    head -n 1) || fail "stdout is not the first result alone: $(od -c "$out" | head)"
  local line="generate: stopped by SIGINT after 1 of 3 results; the results printed so far are kept (exit 130)"
  [[ $(grep -v -E '^I \[.*\] checkpoint: loaded ' "$err") == "$line" ]] ||
    fail "stderr is not the one line saying so: $(cat "$err")"
}

case "$case_name" in
  setup)
    rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
    "$bin" train --config "$config" --model.seq_len=32 --train.micro_batch=8 --train.global_batch=8 \
      --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 --train.steps=20 \
      --ckpt.dir="$work/ckpt" >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; fail "training failed"; }
    [[ -f $step/manifest.json ]] || fail "no checkpoint $step"
    ;;
  pipe_ids) closed_pipe "--prompt-ids 84,104,101,32" ;;
  pipe_text) closed_pipe "--prompt The" ;;
  sigint_ids) stopped_at_7 INT "--prompt-ids 84,104,101,32" 0 130 ;;
  sigterm_text) stopped_at_7 TERM "--prompt The" 0 143 ;;
  pipe_lines) closed_pipe_lines ;;
  sigint_lines) stopped_lines ;;
  sigint_mpi)
    if ! command -v mpirun >/dev/null; then
      echo "SKIPPED: mpirun is not installed"
      exit 77
    fi
    # Rank 1 is signalled; rank 0, which prints, must stop at the same token.
    stopped_at_7 INT "--prompt The" 1 130 "mpirun --oversubscribe -np 2 --bind-to none --mca btl self,vader -x SHARDTRAIN_FAULT"
    ;;
  *) fail "unknown case" ;;
esac
echo "generate_stream $case_name: OK"
