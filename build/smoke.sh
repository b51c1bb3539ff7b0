#!/usr/bin/env bash
# Smoke test of a built keyop binary, run the way it is used on a board: the
# binary alone in an empty directory, with a PATH that holds no node, no bun
# and no node_modules. Starts the agent, publishes with the binary, pulls
# with curl over the Unix socket, makes a CA and a certificate, stops the
# agent. Prints the start-up time (process start to socket answering) and,
# when run natively, the idle RSS.
#
#   build/smoke.sh BINARY [RUNNER ...]
#   build/smoke.sh dist/keyop-linux-x64
#   build/smoke.sh dist/keyop-linux-arm64 qemu-aarch64-static -L /usr/aarch64-linux-gnu
set -euo pipefail

bin=$(readlink -f "$1")
shift
runner=("$@")
name=$(basename "$bin")

work=$(mktemp -d)
agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A PATH with only what this script itself needs: no node, no bun.
mkdir -p "$work/bin" "$work/board"
for tool in sh curl grep sleep cat date kill ls rm seq tail tr; do
  ln -s "$(command -v "$tool")" "$work/bin/$tool"
done
[ ${#runner[@]} -gt 0 ] && ln -s "$(command -v "${runner[0]}")" "$work/bin/${runner[0]}"
cp "$bin" "$work/board/keyop"
cd "$work/board"
export PATH="$work/bin" HOME="$work/board"
unset KEYOP_SOCKET NODE_PATH BUN_INSTALL || true
if command -v node >/dev/null || command -v bun >/dev/null; then echo "smoke: node or bun is reachable" >&2; exit 1; fi

fail() { echo "smoke $name: FAILED: $*" >&2; [ -f run.log ] && tail -20 run.log >&2; exit 1; }
k() { "${runner[@]}" ./keyop "$@"; }

k version | grep -q "^keyop " || fail "version"
echo "smoke $name: $(k version)"

t0=$(date +%s%N)
"${runner[@]}" ./keyop run --data-dir data --socket data/keyop.sock >run.log 2>&1 &
agent_pid=$!
up=""
for _ in $(seq 1 600); do
  if curl -sf --unix-socket data/keyop.sock http://keyop/healthz >/dev/null 2>&1; then up=1; break; fi
  kill -0 "$agent_pid" 2>/dev/null || fail "agent exited"
  sleep 0.05
done
[ -n "$up" ] || fail "agent socket did not answer within 30 s"
ready_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
# keyop run restarts itself once with mimalloc's options set (src/cli/allocator.ts); natively
# the same pid must now carry it. (Under qemu-user, the restart needs binfmt_misc; without it the
# agent says so and runs untuned, which the run above has shown works.)
if [ ${#runner[@]} -eq 0 ]; then
  tr '\0' '\n' <"/proc/$agent_pid/environ" | grep -q '^MIMALLOC_PURGE_DELAY=10000$' || fail "allocator tuning not applied"
  tr '\0' '\n' <"/proc/$agent_pid/environ" | grep -q '^MIMALLOC_PURGE_HOLES=0$' || fail "allocator tuning (holes) not applied"
  tr '\0' '\n' <"/proc/$agent_pid/environ" | grep -q '^MIMALLOC_PURGE_HOLES_MIN_INTERVAL=10000$' || fail "allocator tuning (sweep interval) not applied"
fi

k pub smoke.readings '{"celsius":21.5}' --type reading --socket data/keyop.sock >pub.json || fail "pub"
grep -q '"seq":1' pub.json || fail "pub answer: $(cat pub.json)"
curl -sf --unix-socket data/keyop.sock "http://keyop/v1/channels/smoke.readings/messages?subscriber=smoke&from=earliest" >pull.json || fail "pull"
grep -q '"celsius":21.5' pull.json || fail "pull answer: $(cat pull.json)"

k cert ca --out-dir pki >/dev/null || fail "cert ca"
k cert issue --name board-1 --ca-dir pki --out-dir pki --ip 127.0.0.1 >/dev/null || fail "cert issue"
for f in ca.crt ca.key board-1.crt board-1.key; do [ -s "pki/$f" ] || fail "pki/$f missing"; done
k cert inspect pki/board-1.crt | grep -q "board-1" || fail "cert inspect"

rss=""
if [ ${#runner[@]} -eq 0 ]; then
  sleep 1 # idle a moment before reading the RSS
  rss=$(grep -E '^(VmRSS|RssAnon)' "/proc/$agent_pid/status" | tr -s ' ' | tr '\n' ' ')
fi

kill -TERM "$agent_pid"
for _ in $(seq 1 200); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$agent_pid" 2>/dev/null && fail "agent did not stop on SIGTERM"
wait "$agent_pid" || fail "agent exited non-zero on SIGTERM"
agent_pid=""
[ -e data/keyop.sock ] && fail "socket file left behind"

echo "smoke $name: ok; socket ready ${ready_ms} ms after start${rss:+; idle $rss}"
