#!/usr/bin/env python3
"""Answer COUNT requests on CHANNEL with double their payload's "n" (standard library only).

usage: responder.py CHANNEL SUBSCRIBER COUNT   (socket from $KEYOP_SOCKET)
"""
import json
import sys

from keyop_unix import DEFAULT_SOCKET, KeyopError, UnixHTTPConnection, ack, reply, stream


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    channel, subscriber, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    conn = UnixHTTPConnection(DEFAULT_SOCKET)
    answered = 0
    for msg in stream(DEFAULT_SOCKET, channel, subscriber):
        if "reply_to" in msg:
            try:
                reply(conn, msg, "doubled", {"doubled": msg["payload"]["n"] * 2})
            except KeyopError as err:
                if err.code != "no_request":  # the requester gave up: nothing to do
                    raise
            answered += 1
        ack(conn, msg["channel"], subscriber, msg["seq"])
        print(json.dumps({"answered": msg["id"]}), flush=True)
        if answered >= count:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
