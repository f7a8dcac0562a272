#!/usr/bin/env bash
# bench/kernel_trace_report.py on a made-up timeline with known answers: each 200 us step has three kernels on the
# compute stream (busy 120 us) with gaps of 1, 3 and 76 us, and on a second stream a 30 us kernel beside nothing
# and a 20 us copy of which 17 us run beside compute kernels. Steps are cut at the marker kernel; the first (--skip)
# and the last interval are left out. A trace without enough markers is refused with a message. The same trace with
# API records gives the host's lead and the gaps it left. A third timeline gives each kind of gap's cause.
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
# The same timeline with correlation ids and API records (ST_KERNEL_TRACE_API=1): the embedding and gemm kernels
# are launched 50 and 40 us before their step, the ln kernel 2 us before it starts, 1 us after gemm ended. So each
# step has one host-late gap (3 us, its host-late part 1 us), and the host leads by 50 us (median), 2 us (least).
"$py" - "$dir/trace.csv" "$dir/api.csv" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
out = ["kind,start_ns,end_ns,device,stream,bytes,correlation,name"]
us, corr = 1000, 0
for line in lines[1:]:
    kind, start, rest = line.split(",", 2)
    corr += 1
    end, device, stream, nbytes, name = rest.split(",", 4)
    out.append(f"{kind},{start},{end},{device},{stream},{nbytes},{corr},{name}")
    step_start = int(start) // (200 * us) * (200 * us)
    issued = {'"gemm"': step_start - 40 * us, '"ln"': int(start) - 2 * us}.get(name, step_start - 50 * us)
    out.append(f'api,{issued},{issued + 500},0,1,0,{corr},"cudaLaunchKernel"')
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
out=$("$py" "$SRC/bench/kernel_trace_report.py" --skip 1 "$dir/api.csv" 2>&1) || fail "exit $? with API records: $out"
echo "$out"
[[ $(val "compute stream idle") == 0.080 ]] || fail "idle with API records: $(val 'compute stream idle')"
grep -Eq "^host lead, kernel start - launch call start: median +50.0 us, least +2.0 us$" <<<"$out" || fail "host lead"
grep -Eq "^gaps the host left +1 gaps +0.003 ms, host-late part +0.001 ms$" <<<"$out" || fail "host-late gaps"
# What the gaps have in them. Each 200 us step: kernels on stream 7 at 0-10 (the marker), 13-50, 60-100 and 140-150;
# a memset on stream 7 at 55 (in the 10 us gap) and one at 137 (in the 40 us gap, which stream 8's 100-135 kernel
# fills for 35 us: that gap is the other stream's); the 3 us gap and the 50 us one to the next step have neither.
"$py" - "$dir/causes.csv" <<'PY'
import sys
rows = ["kind,start_ns,end_ns,device,stream,bytes,correlation,name"]
us = 1000
for step in range(6):
    t = step * 200 * us
    for kind, a, b, stream, name in [("kernel", 0, 10, 7, "embedding_forward_kernel"), ("kernel", 13, 50, 7, "k2"),
                                     ("memset", 55, 56, 7, ""), ("kernel", 60, 100, 7, "gemm"),
                                     ("kernel", 100, 135, 8, "adamw"), ("memset", 137, 138, 7, ""),
                                     ("kernel", 140, 150, 7, "k4")]:
        rows.append(f'{kind},{t + a * us},{t + b * us},0,{stream},4,,"{name}"')
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
out=$("$py" "$SRC/bench/kernel_trace_report.py" --skip 1 "$dir/causes.csv" 2>&1) || fail "exit $? on the causes trace: $out"
echo "$out"
cause() { grep -m1 "^  $1" <<<"$out" | awk '{print $(NF-3), $(NF-1)}'; }
[[ $(cause "another stream") == "1 0.040" ]] || fail "gaps of another stream's kernels: $(cause 'another stream')"
[[ $(cause "a memset") == "1 0.010" ]] || fail "gaps with a memset: $(cause 'a memset')"
[[ $(cause "neither") == "2 0.053" ]] || fail "gaps with neither: $(cause neither)"
echo PASS
