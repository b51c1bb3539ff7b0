#!/usr/bin/env python3
"""Publish COUNT messages to CHANNEL and print each receipt (standard library only).

usage: publish.py CHANNEL COUNT   (socket from $KEYOP_SOCKET, default ./keyop-data/keyop.sock)
"""
import json
import sys

from keyop_unix import DEFAULT_SOCKET, UnixHTTPConnection, publish


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    channel, count = sys.argv[1], int(sys.argv[2])
    conn = UnixHTTPConnection(DEFAULT_SOCKET)  # one keep-alive connection for every publish
    for n in range(count):
        receipt = publish(conn, channel, "example.reading", {"n": n, "celsius": 20 + n / 10})
        print(json.dumps(receipt), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
