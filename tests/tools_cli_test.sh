#!/usr/bin/env bash
# The command-line contract of every tool in tools/ (tools/cli.h), without running a benchmark: for each tool,
#   --help            exits 0 and prints the usage (and --csv / --json on the benchmarks) on stdout
#   each bad value    exits 2 with one line "<tool>: error: ..." and one line pointing to --help on stderr
#   an unknown flag   the same; a misspelt flag (two letters of a real one swapped) names the real one
#   a missing value   the same (an option that takes a value, given last without one)
#   --help            options in groups, no line wider than 100 columns
# Every call runs under a 10 s timeout: a bad value that were accepted would start a real run and fail here.
#   bash tests/tools_cli_test.sh build/release/tools/demo build/release/tools/bench_core ...   (ctest: tools_cli)
set -u

# Per tool: bad values (one case per line) and an option that takes a value. A tool missing from this table fails.
bad_values() {
  case $1 in
    demo) printf '%s\n' "--steps 0" "--steps -5" "--hidden abc" "--steps 1.5" ;;
    bench_core) printf '%s\n' "--csv /nonexistent-dir/out.csv" "--json /" "--profile /nonexistent-dir/trace.json" ;;
    bench_train) printf '%s\n' "--steps 0" "--rounds 0" "--threads x" "--heads 3" "--batch 1e3" ;;
    bench_ascender) printf '%s\n' "--n abc" "--n -5" "--n 128,0" "--n 128,,512" "--reps 0" "--impl dense,bogus" \
                              "--device tpu" ;;
    bench_firing) printf '%s\n' "--reps 0" "--rates 0.5,abc" "--rates 2" "--rates nan" ;;
    bench_asam) printf '%s\n' "--n -5" "--n 512," "--impl chunked,nope" "--naive-gb -1" "--reps 0" ;;
    bench_gpu) printf '%s\n' "--csv /nonexistent-dir/out.csv" ;;
    bench_ddp) printf '%s\n' "--steps 0" "--batch abc" ;;
    cudnn_sdpa_check) printf '%s\n' "/nonexistent-dir/device.json" ;;
    # ---- tools added later: their cases here (and the tool in tools/CMakeLists.txt's ASC_TOOLS) ----
    train) printf '%s\n' "--model bogus" "--heads 0" "--dropout 2" "--d-model abc" "--profile x" ;;
    bench_loader) printf '%s\n' "--tasks bogus" "--batch 0" "--steps abc" "--d-model 6" ;;
    stats) printf '%s\n' "bogus" "compare --a /nonexistent-dir --b /nonexistent-dir" "compare --resamples 0" \
                         "compare --a . --b . --resamples abc" "json a.json b.json" \
                         "compare --a . --b . --claim 0" "compare --a . --b . --claim 0.01 --direction -1" \
                         "compare --a . --b . --claim x" "compare --a . --b . --claim 0.01 --direction 2" ;;
    predict) printf '%s\n' "--batch 0" "--progress loud" "--device tpu" "--images /nonexistent.idx" \
                           "--out x.txt" ;;
    sample) printf '%s\n' "--temperature -1" "--top-p 0" "--top-k x" "--max-new-tokens 0" "--device tpu" "--seed -1" ;;
    *) return 1 ;;
  esac
}
# Arguments a tool needs besides the one under test (so that the error is about that one).
required_args() {
  case $1 in
    cudnn_sdpa_check) echo "$(dirname "$0")/../tools/cudnn_devices/a100.json" ;;
    stats) echo compare ;;
    sample) echo --run . --prompt x ;;
    predict) echo --run . --ids /dev/null ;;
  esac
}
# The option groups a tool's --help shows (each a heading line "NAME:"), '|'-separated; stats: its compare subcommand's.
help_groups() {
  case $1 in
    train) echo "Task and data|Model|Optimisation|Run and output|Language model (--model lm)" ;;
    predict) echo "Model|Inputs (one of)|Output" ;;
    sample) echo "Model|Prompts|Decoding" ;;
    stats) echo "Runs|Statistics|Verdict|Output" ;;
    demo) echo "Model|Optimisation|Data and seed" ;;
  esac
}
value_option() {
  case $1 in
    demo | bench_train | bench_ddp) echo --steps ;;
    train) echo --heads ;;
    bench_loader) echo --batch ;;
    stats) echo --resamples ;;
    sample) echo --temperature ;;
    predict) echo --batch ;;
    bench_ascender | bench_asam) echo --n ;;
    bench_firing) echo --rates ;;
    *) echo --csv ;;
  esac
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The checks of one tool, run in the background (the tools run side by side: most of a call is loading the
# libraries); a line "FAIL ..." for each broken promise.
fail() { echo "FAIL $*"; }

# Runs tool with the given arguments; expects exit 2, one error line first, then the pointer to --help, on stderr.
expect_usage_error() {
  local tool=$1 name=$2 out=$3
  shift 3
  timeout 10 "$tool" "$@" >"$out.out" 2>"$out.err"
  local rc=$?
  if [ $rc -ne 2 ]; then
    fail "$name $*: exit $rc, expected 2"
    head -5 "$out.err"
    return
  fi
  head -1 "$out.err" | grep -q "^$name: error: ." || fail "$name $*: first line on stderr is not '$name: error: ...'"
  [ "$(grep -c 'error:' "$out.err")" -eq 1 ] || fail "$name $*: not exactly one error line"
  grep -q "^Run '$name --help'" "$out.err" || fail "$name $*: no pointer to --help on stderr"
  [ "$(wc -l <"$out.err")" -eq 2 ] || fail "$name $*: $(wc -l <"$out.err") lines on stderr, expected 2"
  [ -s "$out.out" ] && fail "$name $*: printed on stdout"
  echo "ok   $name $*  ->  $(head -1 "$out.err")"
}

check_tool() {
  local tool=$1 name out cases args rc
  name=$(basename "$tool")
  out=$tmp/$name
  if ! cases=$(bad_values "$name"); then
    fail "$name: no cases in tests/tools_cli_test.sh (add its bad values)"
    return
  fi
  # --help: exit 0, the usage on stdout, nothing run.
  timeout 10 "$tool" --help >"$out.out" 2>"$out.err"
  rc=$?
  [ $rc -eq 0 ] || fail "$name --help: exit $rc"
  grep -q '^Usage:' "$out.out" || fail "$name --help: no usage on stdout"
  grep -q -- '--help' "$out.out" || fail "$name --help: options not listed"
  if [[ $name == bench_* ]]; then
    grep -q -- '--csv' "$out.out" && grep -q -- '--json' "$out.out" || fail "$name --help: no --csv / --json"
  fi
  [ -s "$out.err" ] && fail "$name --help: wrote on stderr"
  local wide
  wide=$(awk 'length > 100' "$out.out" | head -1)
  [ -z "$wide" ] || fail "$name --help: a line wider than 100 columns: $wide"
  echo "ok   $name --help ($(wc -l <"$out.out") lines)"
  local groups group
  groups=$(help_groups "$name")
  if [ -n "$groups" ]; then
    if [ "$name" = stats ]; then timeout 10 "$tool" compare --help >"$out.out" 2>/dev/null; fi
    IFS='|' read -r -a group_list <<<"$groups"
    for group in "${group_list[@]}"; do
      grep -qxF "$group:" "$out.out" || fail "$name --help: no option group '$group'"
    done
    echo "ok   $name --help groups: $groups"
  fi
  while IFS= read -r args; do
    # shellcheck disable=SC2086  # each case is a list of words
    expect_usage_error "$tool" "$name" "$out" $args
  done <<<"$cases"
  # shellcheck disable=SC2046  # no arguments or one path without spaces
  expect_usage_error "$tool" "$name" "$out" $(required_args "$name") --no-such-flag
  # shellcheck disable=SC2046
  expect_usage_error "$tool" "$name" "$out" $(required_args "$name") "$(value_option "$name")"
  # a misspelt flag: its third and fourth letters swapped ("--steps" -> "--setps"), answered with the real one
  local real misspelt
  real=$(value_option "$name")
  if [ ${#real} -ge 5 ]; then  # "--n" has no letters to swap
    misspelt="${real:0:3}${real:4:1}${real:3:1}${real:5}"
    # shellcheck disable=SC2046
    expect_usage_error "$tool" "$name" "$out" $(required_args "$name") "$misspelt"
    grep -q -- "did you mean .*$real" "$out.err" || fail "$name $misspelt: the real flag $real not suggested"
  fi
}

[ $# -gt 0 ] || { echo "usage: tools_cli_test.sh TOOL..."; exit 2; }
i=0
for tool in "$@"; do
  check_tool "$tool" >"$tmp/log.$i" 2>&1 &
  i=$((i + 1))
done
wait
failures=0
for ((j = 0; j < i; j++)); do
  cat "$tmp/log.$j"
  failures=$((failures + $(grep -c '^FAIL' "$tmp/log.$j")))
done
if [ $failures -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all tools keep the command-line contract"
