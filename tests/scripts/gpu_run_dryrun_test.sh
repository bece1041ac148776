#!/usr/bin/env bash
# tests/scripts/gpu_run_dryrun_test.sh GPU_RUN [BUILD_DIR]: checks the logic of scripts/gpu-run.sh
# (the GPU check's device phase) without a GPU, in a few seconds: the deadline, the skip
# detection, the summary table, the files left in $OUT, the exit status.
#
# The bundle is fake: every binary is a symlink to one stub that prints, briefly, what the real
# one prints in the lines gpu-run.sh reads (gtest's counts, the example's `backend:` line, the
# soak's counters, benchmark rows with ANSI colours), steered by STUB_* variables. A stub
# compute-sanitizer runs the program it is given. Where BUILD_DIR holds the real
# examples/paged_decode_attention, one more case takes the preflight from it: on a machine
# without a device it must stop a real (non-dry) run.
set -uo pipefail

gpu_run=$(realpath "${1:?usage: gpu_run_dryrun_test.sh GPU_RUN [BUILD_DIR]}")
build_dir=${2:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0

# ---- the stub and the fake bundle ---------------------------------------------------------------
cat >"$tmp/stub" <<'EOF'
#!/usr/bin/env bash
# Stands in for a bundled binary, chosen by the name it is called by.
name=$(basename "$0")
if [[ $name == "${STUB_SLEEP_IN:-}" ]]; then sleep "${STUB_SLEEP:-1}"; fi
fails=0
[[ $name == "${STUB_FAIL:-}" ]] && fails=1
esc=$'\e'
case $name in
  paged_decode_attention)
    echo "backend: ${STUB_BACKEND:-cpu} (stub)"
    echo "decode attention: max |err| = 0 over 4 sequences" ;;
  pagedkv_tests_*)
    # The CUDA instantiations: run where the device is, else skip (fail under REQUIRE_CUDA).
    if [[ ${STUB_TESTS_DEVICE:-${STUB_BACKEND:-cpu}} != cuda ]]; then
      if [[ ${PAGEDKV_REQUIRE_CUDA:-} == 1 ]]; then
        echo "[  FAILED  ] Backends/StubTest.Runs/Cuda (0 ms)"
        fails=1
      else
        echo "[  SKIPPED ] 3 tests, listed below:"
      fi
    elif [[ -n ${STUB_SKIPPED_TEST:-} ]]; then  # a test that skips itself on the device
      echo "[  SKIPPED ] 1 test, listed below:"
      echo "[  SKIPPED ] ${STUB_SKIPPED_TEST}"
    fi
    ((fails)) && echo "[  FAILED  ] StubSuite.FailsOnPurpose (0 ms)"
    echo "[==========] ${STUB_TESTS_RAN:-3} tests from 2 test suites ran. (1 ms total)" ;;
  server_step_loop) echo "server step loop: 16 steps, backend ${STUB_BACKEND:-cpu}" ;;
  pagedkv_soak) echo "ops=20000 mismatches=0 invariant_failures=0 errors=0 ops_per_s=51234" ;;
  pagedkv_bench_kernels)
    echo "${esc}[32mcpu/prefill/write_kv/4096 ${esc}[0m  12 us  vs_copy=0.51"
    echo "${esc}[32mcuda/prefill/write_kv/4096${esc}[0m   3 us  vs_copy=0.83" ;;
  pagedkv_bench_transfer) echo "${esc}[32mBM_Offload/cuda/scattered:1${esc}[0m  40 us  ratio=0.7" ;;
  pagedkv_bench_step) echo "cuda/step/decode/64  9 us  vs_launch=2.1" ;;
  compute-sanitizer)
    # --tool T and options, then the program and its arguments.
    while [[ $# -gt 0 && $1 == -* ]]; do
      case $1 in --tool | --error-exitcode | --report-api-errors | --print-limit) shift ;; esac
      shift
    done
    "$@"
    rc=$?
    echo "========= ERROR SUMMARY: 0 errors"
    exit "$rc" ;;
  *) echo "stub: unknown name $name" >&2; exit 99 ;;
esac
exit "$fails"
EOF
chmod +x "$tmp/stub"
ln -s "$tmp/stub" "$tmp/compute-sanitizer"

# make_bundle DIR: the layout scripts/gpu-check --prepare makes, every binary a stub.
make_bundle() {
  local b=$1 t
  mkdir -p "$b/lib" "$b/tests" "$b/examples" "$b/tools/soak" "$b/benchmarks"
  for t in tests/pagedkv_tests_backend tests/pagedkv_tests_kernels tests/pagedkv_tests_runtime \
           examples/paged_decode_attention examples/server_step_loop tools/soak/pagedkv_soak \
           benchmarks/pagedkv_bench_kernels benchmarks/pagedkv_bench_transfer \
           benchmarks/pagedkv_bench_step; do
    ln -s "$tmp/stub" "$b/$t"
  done
  printf 'built 2000-01-01T00:00Z, stub bundle\nsources 0000000000000000\n' >"$b/MANIFEST"
}
make_bundle "$tmp/bundle"

# ---- running it, reading the table ---------------------------------------------------------------
# run CASE [VAR=VALUE...]: runs gpu-run.sh on the stub bundle with a fresh $OUT and the stub
# sanitizer; sets $out and $rc.
run() {
  local name=$1 t0=$SECONDS
  shift
  out=$tmp/out-$name
  mkdir -p "$out"
  env -u PAGEDKV_GPU_DRYRUN -u PAGEDKV_GPU_BUDGET -u PAGEDKV_REQUIRE_CUDA -u PAGEDKV_GPU_ONLY \
    OUT="$out" PAGEDKV_GPU_SANITIZER="$tmp/compute-sanitizer" "$@" \
    bash "$gpu_run" "${bundle:-$tmp/bundle}" >"$tmp/$name.stdout" 2>&1
  rc=$?
  echo "[$name] gpu-run.sh: exit $rc after $((SECONDS - t0)) s"
}
names() { cut -c1-18 "$out/summary.txt" | sed 's/ *$//'; }
status_of() { awk -v n="$1" 'substr($0, 1, 18) ~ "^" n " *$" { print substr($0, 20, 5) }' "$out/summary.txt" | sed 's/ *$//'; }
last_row() { tail -1 "$out/summary.txt"; }

check() {  # check CASE DESCRIPTION COMMAND...: one assertion
  local case=$1 what=$2
  shift 2
  if ! "$@"; then
    echo "FAIL [$case] $what"
    echo "--- summary.txt:"; cat "$out/summary.txt" 2>/dev/null
    echo "--- gpu-run.sh output:"; cat "$tmp/$case.stdout"
    failures=$((failures + 1))
  fi
}
at_most_three_files() {
  local n
  n=$(find "$out" -mindepth 1 | wc -l)
  ((n <= 3)) && [[ -z $(find "$out" -mindepth 1 ! -name summary.txt ! -name bench.txt ! -name logs.tgz) ]]
}
# in_order A B C...: the table's rows are exactly these, in this order.
in_order() { [[ "$(names | paste -sd' ')" == "$*" ]]; }
ends_with_result() { [[ $(last_row) =~ ^result\ +(PASS|FAIL) ]]; }
rc_matches_result() {  # exit 0 exactly when the result row says PASS
  if [[ $(last_row) =~ ^result\ +PASS ]]; then ((rc == 0)); else ((rc != 0)); fi
}

all_rows=(budget bundle bundle device libs preflight decode_attention tests_backend tests_kernels
          tests_runtime step_loop soak_cuda bench_kernels bench_transfer bench_step memcheck_attn
          memcheck_kernels memcheck_soak synccheck_scan result)

# ---- A: a dry run in which everything passes ----------------------------------------------------
run A PAGEDKV_GPU_DRYRUN=1
check A "exit 0" test "$rc" -eq 0
check A "the default budget leaves room for a rerun in a 600 s call" grep -Eq '^budget +420 s' "$out/summary.txt"
check A "every row, in order" in_order "${all_rows[@]}"
check A "preflight is 'dry'" test "$(status_of preflight)" = dry
check A "a stale bundle is noted" grep -q '^bundle  *note  *sources differ' "$out/summary.txt"
check A "the gtest row counts skips" grep -Eq '^tests_kernels +pass +[0-9]+ s; 3 tests from 2 test suites ran; 3 skipped' "$out/summary.txt"
check A "the soak row has its counters" grep -q '^soak_cuda .*mismatches=0 invariant_failures=0 errors=0; ops_per_s=51234' "$out/summary.txt"
check A "result PASS" grep -q '^result  *PASS' <(last_row)
check A "at most three files in \$OUT" at_most_three_files
check A "bench.txt: cuda rows, colours stripped" grep -q '^cuda/prefill/write_kv/4096   3 us' "$out/bench.txt"
check A "bench.txt: transfer rows" grep -q '^BM_Offload/cuda/scattered:1' "$out/bench.txt"
check A "bench.txt: no cpu rows, no escapes" bash -c "! grep -q -e '^cpu/' -e $'\\e' '$out/bench.txt'"
check A "logs.tgz holds the step logs" bash -c "tar -tzf '$out/logs.tgz' | grep -q 'tests_kernels.log'"

# ---- B: a tiny budget: later steps are skipped for lack of time ---------------------------------
# 11 s: the first test step starts with 10-11 s left and takes 2, so every later one has under
# the 10 s a step needs. (On a machine too slow to reach it in 1 s, it is skipped as well.)
run B PAGEDKV_GPU_DRYRUN=1 PAGEDKV_GPU_BUDGET=11 STUB_SLEEP_IN=pagedkv_tests_backend STUB_SLEEP=2
check B "rows in order, sanitizer rows replaced by one skip" in_order budget bundle bundle device \
  libs preflight decode_attention tests_backend tests_kernels tests_runtime step_loop soak_cuda \
  bench_kernels bench_transfer bench_step compute-sanitizer result
for s in tests_kernels tests_runtime step_loop soak_cuda bench_kernels bench_transfer bench_step; do
  check B "$s skipped out of time" grep -Eq "^$s +skip +out of time \([0-9-]+ s left of the 11 s budget\)" "$out/summary.txt"
done
check B "compute-sanitizer skipped out of time" grep -Eq '^compute-sanitizer +skip +out of time' "$out/summary.txt"
check B "the result row says how many were not run" grep -Eq '^result +(PASS|FAIL) .*(7|8) steps not run for lack of time' <(last_row)
check B "ends with the result row" ends_with_result
check B "exit status matches the result row" rc_matches_result
check B "at most three files in \$OUT" at_most_three_files

# ---- C: not a dry run, and the preflight does not say `backend: cuda` -----------------------------
run C STUB_BACKEND=cpu
check C "non-zero exit" test "$rc" -ne 0
check C "stops after the preflight" in_order budget bundle bundle device libs preflight result
check C "preflight FAIL says what it got" grep -q "^preflight  *FAIL  *need 'backend: cuda', got 'backend: cpu (stub)'" "$out/summary.txt"
check C "result FAIL" grep -q '^result  *FAIL' <(last_row)
check C "at most three files in \$OUT" at_most_three_files

# ---- D: PAGEDKV_GPU_DRYRUN=0 is a real run: tests that find no device fail, never skip ----------
run D PAGEDKV_GPU_DRYRUN=0 STUB_BACKEND=cuda STUB_TESTS_DEVICE=none
check D "non-zero exit" test "$rc" -ne 0
check D "tests_backend FAIL (PAGEDKV_REQUIRE_CUDA=1)" test "$(status_of tests_backend)" = FAIL
check D "result FAIL" grep -q '^result  *FAIL' <(last_row)

# ---- E: one failing step makes the result FAIL; the later steps still run ---------------------------
run E PAGEDKV_GPU_DRYRUN=1 STUB_FAIL=pagedkv_tests_kernels
check E "exit 1" test "$rc" -eq 1
check E "tests_kernels FAIL names the test" grep -Eq '^tests_kernels +FAIL +rc=1 after [0-9]+ s; .*failed: StubSuite.FailsOnPurpose' "$out/summary.txt"
check E "later steps still run" test "$(status_of soak_cuda)" = pass
check E "every row, in order" in_order "${all_rows[@]}"
check E "result FAIL" grep -q '^result  *FAIL' <(last_row)
check E "at most three files in \$OUT" at_most_three_files

# ---- H: a real run in which a device test skips itself: the row fails and names it ---------------
run H PAGEDKV_GPU_DRYRUN=0 STUB_BACKEND=cuda STUB_SKIPPED_TEST=Backends/KvCacheTest.Offloads/Cuda
check H "non-zero exit" test "$rc" -ne 0
check H "tests_runtime FAIL names the skipped test" grep -Eq '^tests_runtime +FAIL .*skipped on the device: Backends/KvCacheTest.Offloads/Cuda' "$out/summary.txt"
check H "result FAIL" grep -q '^result  *FAIL' <(last_row)

# ---- I: a skip the script allows (a test that needs the CPU backend by design) passes ----------
run I PAGEDKV_GPU_DRYRUN=0 STUB_BACKEND=cuda \
  STUB_SKIPPED_TEST=Backends/SharedBlocksTest.WindowPagesAnOffloadStillReadsAreWrittenAfterIt/Cuda
check I "exit 0" test "$rc" -eq 0
check I "tests_runtime passes with its skip counted" grep -Eq '^tests_runtime +pass .*; 1 skipped' "$out/summary.txt"

# ---- J: a test step that ran no test (a filter that matched nothing) fails, even in a dry run ----
run J PAGEDKV_GPU_DRYRUN=1 STUB_TESTS_RAN=0
check J "non-zero exit" test "$rc" -ne 0
check J "tests_backend FAIL: ran no test" grep -Eq '^tests_backend +FAIL .*ran no test' "$out/summary.txt"

# ---- K: PAGEDKV_GPU_ONLY reruns the named rows alone, after the preflight ------------------------
run K PAGEDKV_GPU_DRYRUN=1 PAGEDKV_GPU_ONLY=tests_runtime,bench_step
check K "exit 0" test "$rc" -eq 0
check K "the preflight, then only the named rows" in_order budget bundle bundle device libs \
  preflight decode_attention tests_runtime bench_step result
check K "the budget row says what was selected" grep -Eq '^budget .*only: tests_runtime bench_step' "$out/summary.txt"

# ---- F: a TERM during a step (the device tool's limit) still leaves a result and the logs -------
out=$tmp/out-F
mkdir -p "$out"
OUT=$out PAGEDKV_GPU_DRYRUN=1 PAGEDKV_GPU_SANITIZER=none STUB_SLEEP_IN=pagedkv_tests_kernels \
  STUB_SLEEP=30 bash "$gpu_run" "$tmp/bundle" >"$tmp/F.stdout" 2>&1 &
pid=$!
for _ in $(seq 100); do  # until tests_kernels is running (at most 10 s)
  grep -q '^tests_backend' "$out/summary.txt" 2>/dev/null && break
  sleep 0.1
done
sleep 0.3
t0=$SECONDS
kill -TERM "$pid"
wait "$pid"
rc=$?
check F "stops at once, not after the step's budget" test $((SECONDS - t0)) -le 20
check F "non-zero exit" test "$rc" -ne 0
check F "a killed row, then the result" bash -c "tail -2 '$out/summary.txt' | head -1 | grep -q '^killed  *FAIL'"
check F "result FAIL" grep -q '^result  *FAIL' <(last_row)
check F "logs.tgz written" test -s "$out/logs.tgz"
check F "at most three files in \$OUT" at_most_three_files

# ---- G: the real example of a CPU build as the preflight of a real run --------------------------
real=${build_dir:+$build_dir/examples/paged_decode_attention}
if [[ -n $real && -x $real ]]; then
  make_bundle "$tmp/bundle-real"
  rm "$tmp/bundle-real/examples/paged_decode_attention"
  ln -s "$(realpath "$real")" "$tmp/bundle-real/examples/paged_decode_attention"
  bundle=$tmp/bundle-real run G
  if grep -q '^preflight  *pass  *backend: cuda' "$out/summary.txt"; then
    echo "note [G] this machine has a device: the real example says backend: cuda"
  else
    check G "a real run without a device fails at the preflight" grep -q '^preflight  *FAIL' "$out/summary.txt"
    check G "non-zero exit" test "$rc" -ne 0
  fi
else
  echo "note [G] no examples/paged_decode_attention in '${build_dir}': case skipped"
fi

if ((failures)); then
  echo "gpu_run_dryrun_test: $failures checks FAILED"
  exit 1
fi
echo "gpu_run_dryrun_test: all checks passed in $SECONDS s"
