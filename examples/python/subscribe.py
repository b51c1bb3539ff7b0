#!/usr/bin/env python3
"""Stream CHANNEL to the durable subscriber NAME, print each envelope and ack it.

usage: subscribe.py CHANNEL NAME [MAX]   (stops after MAX messages; from the earliest for a new NAME)
"""
import json
import sys

from keyop_unix import DEFAULT_SOCKET, UnixHTTPConnection, ack, stream


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    channel, name = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[3]) if len(sys.argv) == 4 else None
    acks = UnixHTTPConnection(DEFAULT_SOCKET)  # acks go on their own connection
    seen = 0
    for msg in stream(DEFAULT_SOCKET, channel, name, start="earliest"):
        print(json.dumps(msg), flush=True)
        ack(acks, msg["channel"], name, msg["seq"])  # only after we are done with it: at-least-once
        seen += 1
        if limit is not None and seen >= limit:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
