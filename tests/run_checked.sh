#!/usr/bin/env bash
# Runs the test binary and fails when a sanitizer or valgrind reported anything.
# Criterion counts a test as passed before its worker process exits, so a leak
# report printed at exit (LeakSanitizer, valgrind) would not change the verdict
# on its own; this wrapper reads the output instead.
#   tests/run_checked.sh LOG COMMAND...
set -uo pipefail
log=$1
shift
"$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:|==[0-9]+== (Invalid|Conditional|Mismatched|Syscall)|are (definitely|indirectly) lost|ERROR SUMMARY: [1-9]' "$log"; then
    echo "checked run: sanitizer or valgrind reports above (full output in $log)" >&2
    exit 1
fi
exit "$status"
