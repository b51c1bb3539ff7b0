#!/usr/bin/env python3
"""One worker of a queue group: every worker started with the same NAME
shares the messages of CHANNEL, each message goes to one of them, and what a
worker had not acked when it died goes to another.

usage: worker.py CHANNEL NAME [WORK_MS]

Prints "<seq> <id>" for each message it handled, then acks it (only then:
at-least-once). WORK_MS (default 0) stands for the time the work takes.
"""
import sys
import time

from keyop_unix import DEFAULT_SOCKET, UnixHTTPConnection, ack, stream


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    channel, name = sys.argv[1], sys.argv[2]
    work_ms = int(sys.argv[3]) if len(sys.argv) == 4 else 0
    acks = UnixHTTPConnection(DEFAULT_SOCKET)
    # One message at a time: the other workers take the rest meanwhile.
    for msg in stream(DEFAULT_SOCKET, channel, name, start="earliest", max_inflight=1, queue=True):
        if work_ms:
            time.sleep(work_ms / 1000)
        print(msg["seq"], msg["id"], flush=True)
        ack(acks, msg["channel"], name, msg["seq"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
