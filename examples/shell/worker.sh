#!/bin/sh
# One worker of a queue group with curl: every worker started with the same
# NAME shares CHANNEL's messages; each message goes to one of them and is
# acked by itself; what a worker had not acked when it died goes to another.
# usage: worker.sh CHANNEL NAME [MAX]   (socket from $KEYOP_SOCKET, default ./keyop-data/keyop.sock)
# Prints "<seq> <payload>" for each message it handled; stops after MAX (default: never).
set -eu
SOCK=${KEYOP_SOCKET:-./keyop-data/keyop.sock}
CHANNEL=$1
NAME=$2
MAX=${3:-0}
api() { curl --silent --show-error --fail-with-body --unix-socket "$SOCK" "$@"; }

# The stream comes through a FIFO so that the loop runs in this shell and can end curl when it stops.
dir=$(mktemp -d)
mkfifo "$dir/stream"
# One message in hand at a time (max_inflight=1): the other workers take the rest meanwhile.
# -N: each line as it comes; empty lines are keep-alives.
# (curl itself, not the api function: $! must be curl's pid for the trap to end it.)
# Its complaints wait in a file: when this worker stops it, curl may still get to say that its
# output closed; they are shown only when the stream ended by itself.
curl --silent --show-error --fail-with-body --unix-socket "$SOCK" -N \
  "http://keyop/v1/channels/$CHANNEL/stream?subscriber=$NAME&from=earliest&queue=true&max_inflight=1" >"$dir/stream" 2>"$dir/stream.err" &
curl_pid=$!
trap 'kill $curl_pid 2>/dev/null || true; rm -rf "$dir"' EXIT
trap 'exit 143' TERM INT

n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  seq=$(printf '%s' "$line" | grep -o '"seq":[0-9]*' | head -n 1 | cut -d: -f2)
  payload=$(printf '%s' "$line" | grep -o '"payload":[^,}]*' | head -n 1 | cut -d: -f2-)
  echo "$seq $payload" # the work
  # Acked only once done: at-least-once.
  api -X POST -H 'content-type: application/json' -d "{\"seq\":$seq}" \
    "http://keyop/v1/channels/$CHANNEL/subscribers/$NAME/ack" >/dev/null
  n=$((n + 1))
  if [ "$MAX" -gt 0 ] && [ "$n" -ge "$MAX" ]; then exit 0; fi
done <"$dir/stream"
# The stream ended by itself (the agent stopped, or refused it): say why, with curl's status.
cat "$dir/stream.err" >&2
wait "$curl_pid"
