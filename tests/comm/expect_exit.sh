#!/bin/sh
# Runs a command and passes only if it ended the expected way:
#   expect_exit.sh EXIT_CODE REGEX -- COMMAND [ARGS...]
# EXIT_CODE is a number (0 included), or "nonzero" for any failure; REGEX (grep -E) must match a line of
# the command's output (stdout and stderr together). ctest's PASS_REGULAR_EXPRESSION alone would ignore
# the exit code and WILL_FAIL alone the message; this checks both. The output is echoed either way.
set -u
if [ "$#" -lt 4 ] || [ "$3" != "--" ]; then
  echo "usage: $0 EXIT_CODE|nonzero REGEX -- COMMAND [ARGS...]" >&2
  exit 2
fi
expected=$1
regex=$2
shift 3
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$expected" = nonzero ]; then
  if [ "$rc" -eq 0 ]; then
    echo "expect_exit: FAIL: the command exited 0, expected a failure" >&2
    exit 1
  fi
elif [ "$rc" -ne "$expected" ]; then
  echo "expect_exit: FAIL: exit code $rc, expected $expected" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -E -q -- "$regex"; then
  echo "expect_exit: FAIL: no line of the output matches /$regex/" >&2
  exit 1
fi
echo "expect_exit: ok: exit code $rc and output matches /$regex/"
