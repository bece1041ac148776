#!/usr/bin/env bash
# scripts/gpu-run.sh DIR: the device phase of the GPU check, sized for one 600 s device call.
#
# DIR is a bundle made by `scripts/gpu-check --prepare DIR` on a machine with the toolchain (the
# device has nvcc but not spdlog, gtest or benchmark, and no network). From the repository root:
#   here:    scripts/gpu-check --prepare build/gpu-prep
#   device:  run(command="bash scripts/gpu-run.sh build/gpu-prep", carry=["build/gpu-prep"],
#                timeout_s=600)
#
# One global deadline (PAGEDKV_GPU_BUDGET seconds, default 420, so that a 600 s call leaves room
# for a short rerun) caps every step: a step gets min(its own budget, time left) and is skipped
# when under 10 s are left. PAGEDKV_GPU_ONLY="tests_runtime bench_step" (names of rows, space- or
# comma-separated) runs only those steps after the preflight: a rerun of what a first run cut
# short or failed. A row is appended to
# $OUT/summary.txt (and printed) as each step ends, so a kill at the tool's limit still leaves a
# readable summary. At most three files land in $OUT: summary.txt, bench.txt (the cuda rows of
# the benchmarks, ANSI colours stripped, refreshed after each benchmark) and logs.tgz (every
# step's full log, written at the end). Without $OUT they go to DIR/gpu-run-out.
#
# The preflight requires examples/paged_decode_attention to report `backend: cuda`; otherwise
# the run stops there and fails (an all-skipped run must not pass). PAGEDKV_GPU_DRYRUN=1 lifts
# that requirement, so the whole sequence can be exercised on a machine without a GPU
# (tests/scripts/gpu_run_dryrun_test.sh does, in CI, against stub binaries).
# PAGEDKV_GPU_SANITIZER names the compute-sanitizer to use ("none": skip those rows); by default
# it is looked for on PATH, in $CUDA_HOME/bin and /usr/local/cuda*/bin.
# A TERM or INT (the device tool's limit) stops the running step at once and still writes the
# result row, bench.txt and logs.tgz.
# A test step passes only when its binary exits 0, ran at least one test and, in a real run,
# skipped none but those PAGEDKV_GPU_ALLOWED_SKIPS names (a regex over test names; by default
# the tests that need the CPU backend by design).
# Exit status: 0 when no row says FAIL and at least one step ran, 1 otherwise, 2 for bad usage.
set -uo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# source_hash: a short hash of the files a bundle is built from. --prepare records it in
# DIR/MANIFEST; a run whose tree differs says so (the bundle may be stale).
source_hash() {
  (cd "$repo_root" &&
    find CMakeLists.txt cmake include src kernels tests examples tools benchmarks bindings -type f \
      -print0 2>/dev/null |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}
if [[ ${1:-} == --source-hash ]]; then source_hash; exit 0; fi

if [[ $# -ne 1 || $1 == -* ]]; then
  echo "usage: scripts/gpu-run.sh DIR   (DIR made by scripts/gpu-check --prepare DIR)" >&2
  exit 2
fi
B=$(realpath -m "$1")
if [[ ! -d $B/lib || ! -x $B/examples/paged_decode_attention ]]; then
  echo "gpu-run: $B is not a bundle; run scripts/gpu-check --prepare $1 first" >&2
  exit 2
fi
budget=${PAGEDKV_GPU_BUDGET:-420}
only_list=${PAGEDKV_GPU_ONLY:-}
only=" ${only_list//,/ } "
allowed_skips=${PAGEDKV_GPU_ALLOWED_SKIPS:-'WindowPagesAnOffloadStillReadsAreWrittenAfterIt'}
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu-run: PAGEDKV_GPU_BUDGET must be whole seconds" >&2; exit 2; }
dry=0
[[ ${PAGEDKV_GPU_DRYRUN:-0} == 1 ]] && dry=1

out=${OUT:-$B/gpu-run-out}
mkdir -p "$out" || exit 2
summary=$out/summary.txt
: >"$summary"
work=$(mktemp -d "${TMPDIR:-/tmp}/pagedkv-gpu-run.XXXXXX") || exit 2
deadline=$((SECONDS + budget))
status=0
out_of_time=0  # steps skipped because the deadline was near
ran=0          # steps that ran (passed or not)
child=""       # the bounded command running now, if any

export PAGEDKV_LOG_LEVEL=warn
# A CUDA test that finds no device fails instead of skipping (tests/support/backend_test.hpp).
# Keyed on `dry`, not on the variable being set: PAGEDKV_GPU_DRYRUN=0 is a real run.
((dry)) || export PAGEDKV_REQUIRE_CUDA=1
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The binaries of the bundle, by role.
t_backend=$B/tests/pagedkv_tests_backend
t_kernels=$B/tests/pagedkv_tests_kernels
t_runtime=$B/tests/pagedkv_tests_runtime
x_attention=$B/examples/paged_decode_attention
x_step_loop=$B/examples/server_step_loop
x_soak=$B/tools/soak/pagedkv_soak
b_kernels=$B/benchmarks/pagedkv_bench_kernels
b_transfer=$B/benchmarks/pagedkv_bench_transfer
b_step=$B/benchmarks/pagedkv_bench_step
binaries=("$t_backend" "$t_kernels" "$t_runtime" "$x_attention" "$x_step_loop" "$x_soak"
          "$b_kernels" "$b_transfer" "$b_step")

# row NAME STATUS DETAIL: one summary line, appended at once.
row() { printf '%-18s %-5s %s\n' "$1" "$2" "$3" | tee -a "$summary"; }

strip_ansi() { sed 's/\x1b\[[0-9;]*[A-Za-z]//g' "$@"; }

# The cuda rows of every benchmark log so far (and bench_step's verdict lines), into bench.txt.
write_bench() {
  local name log
  : >"$out/bench.txt"
  for name in bench_kernels bench_transfer bench_step; do
    log=$work/$name.log
    [[ -f $log ]] || continue
    {
      echo "== pagedkv_$name"
      strip_ansi "$log" | grep -E '^(Benchmark|-{10,}|cuda/|BM_[A-Za-z]+/cuda/|  cuda/)' ||
        echo "(no cuda rows)"
      echo
    } >>"$out/bench.txt"
  done
}

finished=0
finish() {
  ((finished)) && exit "$status"
  finished=1
  trap - TERM INT
  write_bench
  local note="$SECONDS s of a $budget s budget"
  ((out_of_time)) && note+="; $out_of_time steps not run for lack of time"
  if ((ran == 0)); then
    note+="; no step ran"  # nothing was checked: never a pass
    status=1
  fi
  if ((status == 0)); then row result PASS "$note"
  else row result FAIL "$note; full logs in logs.tgz"; fi
  tar -C "$work" -czf "$out/logs.tgz" . 2>/dev/null
  rm -rf "$work"
  exit "$status"
}
# shellcheck disable=SC2317  # invoked by the trap
on_signal() {
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null  # timeout passes it on to its command
  row killed FAIL "signal after $SECONDS s"
  status=1
  finish
}
trap on_signal TERM INT

# bounded SECONDS LOG CMD...: runs CMD for at most SECONDS, its output in LOG, and returns its
# exit status (124 or 137 when cut off). It runs in the background and is waited for: bash runs a
# trap only between foreground commands, but it interrupts `wait` at once.
bounded() {
  local secs=$1 log=$2 rc
  shift 2
  timeout -k 5 "$secs" "$@" >"$log" 2>&1 &
  child=$!
  wait "$child"
  rc=$?
  child=""
  return "$rc"
}

# detail KIND LOG: what a row says about a finished step, from its log.
detail() {
  local kind=$1 log=$2 s
  case $kind in
    gtest)
      local ran skipped failed
      ran=$(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$log" | tail -1)
      skipped=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
      failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sed 's/^\[  FAILED  \] //; s/ (.*//' |
               sort -u | head -3 | paste -sd, -)
      s=${ran:-no gtest summary}
      [[ -n $skipped ]] && s+="; $skipped skipped"
      [[ -n $failed ]] && s+="; failed: $failed"
      echo "$s" ;;
    sanitizer)
      s=$(grep -Eo 'ERROR SUMMARY: [0-9]+ errors?' "$log" | tail -1)
      echo "${s:-no ERROR SUMMARY line}" ;;
    soak)
      s=$(grep -Eo 'mismatches=[0-9]+ invariant_failures=[0-9]+ errors=[0-9]+' "$log" | tail -1)
      echo "${s:-no counters}; $(grep -Eo 'ops_per_s=[0-9]+' "$log" | tail -1)" ;;
    bench)
      echo "$(strip_ansi "$log" | grep -cE '^(cuda/|BM_[A-Za-z]+/cuda/)') cuda rows" ;;
    *) strip_ansi "$log" | grep -v '^\s*$' | tail -1 | cut -c1-100 ;;
  esac
}

# selected NAME: whether PAGEDKV_GPU_ONLY (when set) names the step.
selected() { [[ $only == "  " || $only == *" $1 "* ]]; }

# gtest_problem LOG: why a test step that exited 0 still fails ("" when it does not): it ran no
# test (a filter that matches nothing), or, in a real run, it skipped one not allowed to skip.
gtest_problem() {
  local log=$1 n bad
  n=$(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$log" | tail -1 | grep -Eo '^[0-9]+')
  if [[ -z $n || $n == 0 ]]; then
    echo "ran no test"
    return
  fi
  ((dry)) && return
  bad=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$log" | sed 's/^\[  SKIPPED \] //; s/ (.*//' |
        grep -Ev "$allowed_skips" | sort -u | head -3 | paste -sd, -)
  [[ -n $bad ]] && echo "skipped on the device: $bad"
}

# step NAME BUDGET KIND CMD...: runs CMD for at most min(BUDGET, time left) seconds, its output
# in $work/NAME.log, then appends its row. Returns CMD's exit status (or 125 when skipped; 126,
# with no row, when PAGEDKV_GPU_ONLY leaves it out).
step() {
  local name=$1 want=$2 kind=$3 left=$((deadline - SECONDS))
  shift 3
  selected "$name" || return 126
  ((left < want)) && want=$left
  if ((want < 10)); then
    row "$name" skip "out of time (${left} s left of the $budget s budget)"
    out_of_time=$((out_of_time + 1))
    return 125
  fi
  local t0=$SECONDS rc
  ran=$((ran + 1))
  bounded "$want" "$work/$name.log" "$@"
  rc=$?
  local took=$((SECONDS - t0)) info problem=""
  info=$(detail "$kind" "$work/$name.log")
  [[ $kind == gtest ]] && ((rc == 0)) && problem=$(gtest_problem "$work/$name.log")
  if [[ -n $problem ]]; then
    row "$name" FAIL "$took s; $info; $problem (log: $name.log)"
    status=1
    rc=1
  elif ((rc == 0)); then
    row "$name" pass "$took s; $info"
  elif ((rc == 124 || rc == 137)) && [[ $kind == bench ]]; then
    # A benchmark cut short is no correctness failure: keep the rows it printed.
    row "$name" part "stopped at its $want s limit; $info"
  elif ((rc == 124 || rc == 137)); then
    row "$name" FAIL "timed out at $want s; $info (log: $name.log)"
    status=1
  else
    row "$name" FAIL "rc=$rc after $took s; $info (log: $name.log)"
    status=1
  fi
  return "$rc"
}

# ---- 0. What runs where, and the preflight ----------------------------------------------------
row budget "" "$budget s$( ((dry)) && echo '; PAGEDKV_GPU_DRYRUN=1: backend: cuda not required')$([[ $only != "  " ]] && echo "; only:$only")"
if [[ -f $B/MANIFEST ]]; then
  row bundle "" "$(grep -m1 '^built' "$B/MANIFEST" | cut -c1-110)"
  want_hash=$(sed -n 's/^sources //p' "$B/MANIFEST")
  have_hash=$(source_hash)
  if [[ -n $want_hash && -n $have_hash && $want_hash != "$have_hash" ]]; then
    row bundle note "sources differ from the ones the bundle was built from (stale bundle?)"
  fi
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  row device "" "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
else
  row device "" "no nvidia-smi on this machine"
fi

# Every bundled binary must find its libraries. If only libstdc++/libgcc are too old here, use the
# copies the bundle carries in lib/compat (not used by default: they would also be loaded by
# compute-sanitizer and nvidia tools, which may need newer ones).
missing_libs() {
  local b
  command -v ldd >/dev/null 2>&1 || return 0
  for b in "${binaries[@]}"; do
    [[ -x $b ]] || { echo "$(basename "$b"): missing from the bundle"; continue; }
    ldd "$b" 2>&1 | grep 'not found' | sed "s|^|$(basename "$b"): |"
  done | sort -u
}
miss=$(missing_libs)
if [[ -n $miss && -d $B/lib/compat ]] && grep -qE 'GLIBCXX|CXXABI|GCC_|libstdc|libgcc' <<<"$miss"; then
  export LD_LIBRARY_PATH="$B/lib:$B/lib/compat${LD_LIBRARY_PATH#"$B/lib"}"
  row libs note "system libstdc++/libgcc too old; using the bundle's lib/compat"
  miss=$(missing_libs)
fi
if [[ -n $miss ]]; then
  printf '%s\n' "$miss" >"$work/libs.log"
  row libs FAIL "$(head -1 <<<"$miss" | tr -s '\t ' ' ' | cut -c1-110) (log: libs.log)"
  status=1
  finish
fi
row libs pass "all ${#binaries[@]} binaries resolve their libraries"

# The CUDA backend must be the one in use: never an all-skipped pass.
t0=$SECONDS
bounded 60 "$work/preflight.log" "$x_attention"
rc=$?
backend=$(grep -m1 '^backend:' "$work/preflight.log" | cut -c1-170)  # the description ends with the copy-batch path and stream priorities
if [[ $backend == "backend: cuda"* ]]; then
  row preflight pass "$backend"
elif ((dry)); then
  row preflight dry "${backend:-no backend line} (rc=$rc)"
else
  got=$(grep -m1 -E 'backend|error|cannot|CUDA' "$work/preflight.log" | cut -c1-80)
  row preflight FAIL "need 'backend: cuda', got '${got:-nothing}' (rc=$rc; log: preflight.log)"
  status=1
  finish
fi
err=$(grep -Eo 'max \|err\| = [^ ,]+' "$work/preflight.log" | head -1)
if ((rc == 0)); then
  row decode_attention pass "$((SECONDS - t0)) s; ${err:-no max |err| line}"
else
  row decode_attention FAIL "rc=$rc; ${err:-no max |err| line} (log: preflight.log)"
  status=1
fi

# ---- 1. The device instantiations of the typed tests, the bit-for-bit cross-check ------------
# Not --gtest_brief: the summary then names each skipped test, which the row checks.
step tests_backend 90 gtest "$t_backend" --gtest_filter='*Cuda*'
step tests_kernels 90 gtest "$t_kernels" --gtest_filter='*Cuda*'
# The randomized end-to-end test and the fault sweep run here too: a shorter random run fits.
step tests_runtime 150 gtest env PAGEDKV_E2E_STEPS=20000 "$t_runtime" --gtest_filter='*Cuda*'

# ---- 2. The runtime end to end on the device (upload ring, CoW, offload/restore, events) ------
step step_loop 60 plain "$x_step_loop"
step soak_cuda 90 soak "$x_soak" --backend auto --ops 20000 --seed 1

# ---- 3. Benchmarks: the cuda rows only ---------------------------------------------------------
step bench_kernels 80 bench "$b_kernels" --benchmark_filter='^cuda/' \
  --benchmark_min_time=0.05 --benchmark_color=false
write_bench
step bench_transfer 80 bench "$b_transfer" --benchmark_filter='/cuda/' \
  --benchmark_min_time=0.05 --benchmark_color=false
write_bench
step bench_step 60 bench "$b_step" --quick --benchmark_filter='^cuda/' --benchmark_color=false
write_bench
if ((!dry)); then
  for name in bench_kernels bench_transfer bench_step; do
    [[ -f $work/$name.log ]] || continue
    if ! strip_ansi "$work/$name.log" | grep -qE '^(cuda/|BM_[A-Za-z]+/cuda/)'; then
      row "$name" FAIL "no cuda rows although the backend is cuda"
      status=1
    fi
  done
fi

# ---- 4. compute-sanitizer: memcheck where the kernels run; synccheck on CUB's scan alone ------
# (the kernel bodies use no shared memory or barriers, so racecheck/synccheck only see CUB).
# --report-api-errors no: the tests provoke failing CUDA calls and query unfinished events on
# purpose; memory errors are what these rows are for.
san=""
if [[ -n ${PAGEDKV_GPU_SANITIZER:-} ]]; then
  [[ $PAGEDKV_GPU_SANITIZER != none ]] && san=$PAGEDKV_GPU_SANITIZER
else
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
           /opt/nvidia/compute-sanitizer/compute-sanitizer; do
    [[ -n $c && -x $c ]] && { san=$c; break; }
  done
fi
san_args=(--error-exitcode 3 --report-api-errors no --print-limit 50)
san_selected=0
for s in memcheck_attn memcheck_kernels memcheck_soak synccheck_scan; do
  selected "$s" && san_selected=1
done
if ((!san_selected)); then
  :  # PAGEDKV_GPU_ONLY names none of the sanitizer rows
elif [[ -z $san ]]; then
  if [[ ${PAGEDKV_GPU_SANITIZER:-} == none ]]; then
    row compute-sanitizer skip "PAGEDKV_GPU_SANITIZER=none"
  else
    row compute-sanitizer skip "not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda*/bin)"
  fi
else
  # A probe first, memcheck of the example: under gVisor compute-sanitizer refuses the device
  # ("Device not supported", then error 999); then the sanitizer rows are skipped, not failed.
  probe=go
  if ((deadline - SECONDS < 60)); then
    row compute-sanitizer skip "out of time ($((deadline - SECONDS)) s left)"
    out_of_time=$((out_of_time + 1))
    probe=no
  else
    t0=$SECONDS
    bounded 45 "$work/memcheck_probe.log" "$san" --tool memcheck "${san_args[@]}" "$x_attention"
    rc=$?
    refused=$(grep -m1 -E 'Device not supported|not supported on|Internal Sanitizer Error|failed to initiali[sz]e|Unable to (find|load)' \
              "$work/memcheck_probe.log" | sed 's/^=* *//' | cut -c1-90)
    if [[ -n $refused ]]; then
      row compute-sanitizer skip "refused here: $refused (log: memcheck_probe.log)"
      probe=no
    elif ((rc == 0)); then
      row memcheck_attn pass "$((SECONDS - t0)) s; $(detail sanitizer "$work/memcheck_probe.log")"
    else
      row memcheck_attn FAIL "rc=$rc after $((SECONDS - t0)) s; $(detail sanitizer "$work/memcheck_probe.log") (log: memcheck_probe.log)"
      status=1
    fi
  fi
  if [[ $probe == go ]]; then
    step memcheck_kernels 150 sanitizer "$san" --tool memcheck "${san_args[@]}" \
      "$t_kernels" --gtest_filter='*Cuda*' --gtest_brief=1
    step memcheck_soak 90 sanitizer "$san" --tool memcheck "${san_args[@]}" \
      "$x_soak" --backend auto --ops 2000 --seed 3
    step synccheck_scan 40 sanitizer "$san" --tool synccheck "${san_args[@]}" \
      "$t_kernels" --gtest_filter='IndptrViewTest/Cuda.*' --gtest_brief=1
  fi
fi

finish
