#!/bin/bash
# Where a two-hop message spends its time, stage by stage: applies
# trace.patch to a scratch work tree of HEAD, runs the steady two-hop step
# there with KEYOP_TRACE set, and prints analyze.py's table.
#
#   bash bench/hop-trace/run.sh [step]     (default: "two hops keyop sync=none @1000")
#
# With HOP_TRACE_SCHED=1 it also records the scheduler (`perf sched record`)
# through the run and prints sched.py's account of what the tail waited for.
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
perf_pid=""
if [ "${HOP_TRACE_SCHED:-}" = "1" ]; then
  perf sched record -k mono -a -o "$out/sched.data" >/dev/null 2>&1 &
  perf_pid=$!
fi
(cd "$wt" && KEYOP_TRACE="$out" node_modules/.bin/bun bench/compare.ts --only="steady: $step" | grep -E "p50 / p99|CPU per message")
python3 "$here/analyze.py" "$out"
if [ -n "$perf_pid" ]; then
  kill -INT "$perf_pid"
  wait "$perf_pid" || true
  perf sched timehist -i "$out/sched.data" >"$out/timehist.out" 2>/dev/null
  python3 "$here/sched.py" "$out" "$out/timehist.out"
fi
echo "trace files: $out"
