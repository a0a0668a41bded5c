#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time (ctest's fuzz tests and by hand).
#   run_fuzzer.sh BINARY WORK_DIR SECONDS CORPUS_DIR...
# New inputs go to WORK_DIR/corpus (the committed corpora are only read); a finding is written
# to WORK_DIR/finding-* and fails the run (libFuzzer exits non-zero). -timeout bounds one input
# (a hang is a finding), -rss_limit_mb the memory of the process.
set -euo pipefail
bin=$1 work=$2 seconds=$3
shift 3
mkdir -p "$work/corpus"
dirs=()
for d in "$@"; do [ -d "$d" ] && dirs+=("$d"); done
exec "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/finding-" "$work/corpus" "${dirs[@]}"
