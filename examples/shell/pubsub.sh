#!/bin/sh
# Publish, pull and ack with curl over keyop's Unix socket.
# usage: pubsub.sh [CHANNEL] [SUBSCRIBER]   (socket from $KEYOP_SOCKET, default ./keyop-data/keyop.sock)
set -eu
SOCK=${KEYOP_SOCKET:-./keyop-data/keyop.sock}
CHANNEL=${1:-examples.shell}
NAME=${2:-shell-reader}
api() { curl --silent --show-error --fail-with-body --unix-socket "$SOCK" "$@"; }

# Publish two messages; each answer comes after the durable write.
api -X POST -H 'content-type: application/json' \
  -d '{"type":"example.event","payload":{"door":"open"}}' "http://keyop/v1/channels/$CHANNEL/messages"
echo
api -X POST -H 'content-type: application/json' \
  -d '{"type":"example.event","payload":{"door":"closed"}}' "http://keyop/v1/channels/$CHANNEL/messages"
echo

# Pull up to 10 after the subscriber's cursor (a new subscriber starts at the earliest here),
# waiting up to 2 s for the first.
batch=$(api "http://keyop/v1/channels/$CHANNEL/messages?subscriber=$NAME&from=earliest&max=10&wait=2000")
echo "$batch"

# Ack the last seq we got: cumulative, everything up to it is done.
last=$(printf '%s' "$batch" | grep -o '"seq":[0-9]*' | tail -n 1 | cut -d: -f2)
if [ -n "$last" ]; then
  api -X POST -H 'content-type: application/json' -d "{\"seq\":$last}" \
    "http://keyop/v1/channels/$CHANNEL/subscribers/$NAME/ack"
  echo
fi
