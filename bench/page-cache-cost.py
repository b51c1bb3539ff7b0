#!/usr/bin/env python3
"""What this machine charges for new page-cache memory: writes 1 MiB
chunks of zeros into a new file and prints the time per MiB for each 512
MiB. On a VM whose host backs guest memory only when it is first touched
(or takes freed memory back), the writes slow down once the page cache
grows past the memory the guest already holds; every process that writes
new data pays it, keyop's zero fill ahead of its records among them.

    python3 bench/page-cache-cost.py [MiB=4096] [dir=/tmp]
"""
import os
import sys
import time

total = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
path = os.path.join(sys.argv[2] if len(sys.argv) > 2 else "/tmp", f"keyop-page-cost-{os.getpid()}.bin")
buf = b"\0" * (1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
try:
    t, c0 = time.perf_counter(), time.process_time()
    for i in range(1, total + 1):
        os.write(fd, buf)
        if i % 512 == 0 or i == total:
            now, c = time.perf_counter(), time.process_time()
            n = 512 if i % 512 == 0 else i % 512
            print(f"{i:>6} MiB written: {(now - t) / n * 1e3:.3f} ms per MiB (CPU {(c - c0) / n * 1e3:.3f})", flush=True)
            t, c0 = now, c
finally:
    os.close(fd)
    os.unlink(path)
