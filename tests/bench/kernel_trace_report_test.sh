#!/usr/bin/env bash
# bench/kernel_trace_report.py on a made-up timeline with known answers: each 200 us step has three kernels on the
# compute stream (busy 120 us) with gaps of 1, 3 and 76 us, and on a second stream a 30 us kernel beside nothing
# and a 20 us copy of which 17 us run beside compute kernels. Steps are cut at the marker kernel; the first (--skip)
# and the last interval are left out. A trace without enough markers is refused with a message.
#   kernel_trace_report_test.sh SOURCE_DIR
set -uo pipefail
SRC=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
py=${PYTHON:-python3}
"$py" - "$dir/trace.csv" <<'PY'
import sys
rows = ["kind,start_ns,end_ns,device,stream,bytes,name"]
us = 1000
for step in range(7):
    t = step * 200 * us
    rows.append(f'kernel,{t},{t + 10 * us},0,7,0,"void st::gpu::(anonymous namespace)::embedding_forward_kernel<8, bf16>(int, float)"')
    rows.append(f'kernel,{t + 11 * us},{t + 111 * us},0,7,0,"gemm"')
    rows.append(f'memcpy,{t + 100 * us},{t + 120 * us},0,9,4096,"DtoD"')
    rows.append(f'kernel,{t + 114 * us},{t + 124 * us},0,7,0,"ln"')
    rows.append(f'kernel,{t + 150 * us},{t + 180 * us},0,9,0,"adamw"')
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
out=$("$py" "$SRC/bench/kernel_trace_report.py" --skip 1 "$dir/trace.csv" 2>&1) || fail "exit $?: $out"
echo "$out"
grep -q "4 steps (after 1 skipped), compute stream 7" <<<"$out" || fail "steps or compute stream"
val() { grep -m1 "^$1" <<<"$out" | awk '{print $(NF-1)}'; }
[[ $(val "wall") == 0.200 ]] || fail "wall: $(val wall)"
[[ $(val "compute stream busy") == 0.120 ]] || fail "busy: $(val 'compute stream busy')"
[[ $(val "compute stream idle") == 0.080 ]] || fail "idle: $(val 'compute stream idle')"
gap() { grep -m1 "gaps $1 " <<<"$out" | awk '{print $(NF-3), $(NF-1)}'; }
[[ $(gap "< 2 us") == "1 0.001" ]] || fail "gaps under 2 us: $(gap '< 2 us')"
[[ $(gap "2-5 us") == "1 0.003" ]] || fail "gaps of 2-5 us: $(gap '2-5 us')"
[[ $(gap "5-20 us") == "0 0.000" ]] || fail "gaps of 5-20 us: $(gap '5-20 us')"
[[ $(gap "20-100 us") == "1 0.076" ]] || fail "gaps of 20-100 us: $(gap '20-100 us')"
[[ $(val "stream 9 busy") == 0.050 ]] || fail "other stream busy: $(val 'stream 9 busy')"
[[ $(val "stream 9 beside compute kernels") == 0.017 ]] || fail "overlap: $(val 'stream 9 beside compute kernels')"
grep -q "76.0 us  step 1: after ln | before the next step" <<<"$out" || fail "longest gap"
grep -q "1.0 us  step 4: after embedding_forward_kernel<8, bf16> | before gemm" <<<"$out" || fail "names shortened"
grep -Eq "^ +0\.100 +1  gemm$" <<<"$out" || fail "kernel table row for gemm"
# Too few markers for the steps asked for.
if msg=$("$py" "$SRC/bench/kernel_trace_report.py" --skip 6 "$dir/trace.csv" 2>&1); then fail "accepted --skip 6"; fi
grep -q "7 marker kernels (embedding_forward_kernel) on stream 7; need more than --skip + 2" <<<"$msg" || fail "refusal: $msg"
echo PASS
