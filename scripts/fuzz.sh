#!/usr/bin/env bash
# Runs the coverage-guided fuzz targets in fuzz/ (cargo-fuzz, libFuzzer) for a bounded time.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 600; the targets default to all of them (`cargo fuzz list`).
# Each target starts from its committed corpus fuzz/corpus/<target>/, which is merged and
# minimized (libFuzzer's -merge=1) at the end so it only keeps inputs that add coverage.
# Failing inputs go to fuzz/artifacts/<target>/ and logs to fuzz/target/fuzz-logs/. Prints each
# target's executions, speed and final coverage, and exits non-zero if any target found a
# crash, a hang, a leak or an out-of-memory input.
#
# cargo-fuzz needs nightly-only compiler flags (sanitizers, coverage instrumentation); on a
# stable toolchain RUSTC_BOOTSTRAP=1 unlocks them. The script installs cargo-fuzz if missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-600}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build
logs=target/fuzz-logs
mkdir -p "$logs"

failed=()
summary=()
for target in "${targets[@]}"; do
  corpus="corpus/$target"
  artifacts="artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  log="$logs/$target.log"
  printf '\n=== %s: %s s\n' "$target" "$seconds"
  status=0
  # -timeout: one input running 10 s is a hang, reported as a finding.
  cargo fuzz run "$target" "$corpus" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)' "$log" || true
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  final=$(grep -E '^#[0-9]+[[:space:]]' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)

  # Keep only the inputs that add coverage: merge the grown corpus into a fresh directory.
  # -use_counters=0 counts a covered edge once, not per hit-count bucket, which keeps every
  # edge reached while dropping most inputs, so the committed corpus stays small.
  merged=$(mktemp -d "target/merge-$target.XXXXXX")
  cargo fuzz run "$target" "$merged" "$corpus" -- -merge=1 -use_counters=0 >>"$log" 2>&1
  rm -rf "$corpus"
  mv "$merged" "$corpus"
  size=$(find "$corpus" -type f | wc -l)

  findings=$(find "$artifacts" -type f \
    \( -name 'crash-*' -o -name 'timeout-*' -o -name 'leak-*' -o -name 'oom-*' \) | wc -l)
  line="$target: ${execs:-?} execs, ${speed:-?} exec/s, ${final:-no coverage line}, corpus $size files, findings $findings"
  summary+=("$line")
  if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
    failed+=("$target")
    echo "FINDING in $target (exit $status); see $log and $artifacts/" >&2
    tail -40 "$log" >&2
  fi
done

printf '\n=== summary\n'
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "findings in: ${failed[*]}" >&2
  exit 1
fi
