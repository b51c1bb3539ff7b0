#!/bin/bash
# Where a two-hop message spends its time, stage by stage: applies
# trace.patch to a scratch work tree of HEAD, runs the steady two-hop step
# there with KEYOP_TRACE set, and prints analyze.py's table.
#
#   bash bench/hop-trace/run.sh [step]     (default: "two hops keyop sync=none @1000")
#
# The patch adds a trace hook at each stage (src/trace.ts); it is kept out
# of the shipped code. If it no longer applies, redo its eight hooks by hand.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
step=${1:-"two hops keyop sync=none @1000"}
wt=$(mktemp -d /tmp/keyop-hop-trace-XXXXXX)
out=$(mktemp -d /tmp/keyop-hop-trace-out-XXXXXX)
cleanup() { git -C "$repo" worktree remove --force "$wt" >/dev/null 2>&1 || true; }
trap cleanup EXIT
git -C "$repo" worktree add -q --detach "$wt" HEAD
ln -s "$repo/node_modules" "$wt/node_modules"
git -C "$wt" apply "$here/trace.patch"
(cd "$wt" && KEYOP_TRACE="$out" node_modules/.bin/bun bench/compare.ts --only="steady: $step" | grep -E "p50 / p99|CPU per message")
python3 "$here/analyze.py" "$out"
echo "trace files: $out"
