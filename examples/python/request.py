#!/usr/bin/env python3
"""Send a request with payload {"n": N} to CHANNEL and print the reply's envelope (standard library only).

usage: request.py CHANNEL N   (socket from $KEYOP_SOCKET)
"""
import json
import sys

from keyop_unix import DEFAULT_SOCKET, KeyopError, UnixHTTPConnection, request


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    conn = UnixHTTPConnection(DEFAULT_SOCKET)
    try:
        print(json.dumps(request(conn, sys.argv[1], "ask", {"n": int(sys.argv[2])}, timeout_ms=5000)))
    except KeyopError as err:
        print(f"{err.code}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
