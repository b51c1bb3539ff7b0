#!/usr/bin/env python3
"""Splits each two-hop message's latency by segment, from a capture by wire.ts.

Reads <dir>/wire.pcap, <dir>/received.txt (send time, receipt time in ms per
message) and <dir>/ports.json. The MQTT publishes to device A and from device B
are found by the send time in their JSON; the two TLS links are read by
their record sizes (the most common size is a one-record BATCH, the next
size up one more record), and messages are given to the batches in order,
each to the first batch on the wire at or after it reached the agent.
Prints the segments' medians and, for the messages above 0.5, 0.8 and 1.2
ms, each segment's mean and how often it was the largest.
"""
import collections
import json
import re
import statistics
import struct
import sys

d = sys.argv[1]
ports = json.load(open(f"{d}/ports.json"))
hub, dev_a, dev_b = ports["hub"], ports["devA"], ports["devB"]
raw = open(f"{d}/wire.pcap", "rb").read()
scale = 1e-9 if struct.unpack("<I", raw[:4])[0] == 0xA1B23C4D else 1e-6
packets = []  # (time s, src port, dst port, payload length, captured payload)
off = 24
while off + 16 <= len(raw):
    sec, frac, incl, _ = struct.unpack("<IIII", raw[off : off + 16])
    b = raw[off + 16 : off + 16 + incl]
    off += 16 + incl
    if len(b) < 34 or b[12:14] != b"\x08\x00":
        continue
    ihl = (b[14] & 15) * 4
    total = struct.unpack(">H", b[16:18])[0]
    t = 14 + ihl
    sp, dp = struct.unpack(">HH", b[t : t + 4])
    thl = (b[t + 12] >> 4) * 4
    n = total - ihl - thl
    if n > 0:
        packets.append((sec + frac * scale, sp, dp, n, b[t + thl :]))

flows = collections.defaultdict(list)
for p in packets:
    if p[2] == hub:
        flows[("up", p[1])].append(p)
    elif p[1] == hub:
        flows[("down", p[2])].append(p)
eph = {k[1] for k in flows}
# Device A's link carries data towards the hub, device B's away from it.
a_up = flows[("up", max(eph, key=lambda e: sum(p[3] for p in flows[("up", e)])))]
b_down = flows[("down", max(eph, key=lambda e: sum(p[3] for p in flows[("down", e)])))]


def slots(link, name):
    """One time per record: a batch of n records gives n slots."""
    sizes = collections.Counter(p[3] for p in link)
    one = sizes.most_common(1)[0][0]
    per = next((s - one for s in sorted(sizes) if s > one + 50 and sizes[s] >= 2), None)
    print(f"{name}: one-record batch {one} bytes, {per} more per record")
    out = []
    for p in link:
        if p[3] < one - 20:
            continue  # ACKs, PINGs
        n = 1 if per is None else max(1, round((p[3] - one) / per) + 1)
        out += [p[0]] * n
    return out


stamp = re.compile(rb'\{"t":([0-9.]+)')
at_a, from_b = {}, {}
for p in packets:
    if p[2] == dev_a:
        for m in stamp.finditer(p[4]):
            at_a.setdefault(float(m.group(1)), p[0])
    elif p[1] == dev_b:
        for m in stamp.finditer(p[4]):
            from_b.setdefault(float(m.group(1)), p[0])
received = dict(tuple(map(float, line.split())) for line in open(f"{d}/received.txt") if line.strip())
up, down = slots(a_up, "A -> hub"), slots(b_down, "hub -> B")
rows = []
i = j = 0
for t in sorted(at_a, key=lambda t: (at_a[t], t)):
    while i < len(up) and up[i] < at_a[t]:
        i += 1
    if i >= len(up):
        break
    t_up = up[i]
    i += 1
    while j < len(down) and down[j] < t_up:
        j += 1
    if j >= len(down):
        break
    t_down = down[j]
    j += 1
    if t not in from_b or t not in received:
        continue
    t0 = t / 1000
    rows.append((received[t] / 1000 - t0, [at_a[t] - t0, t_up - at_a[t], t_down - t_up, from_b[t] - t_down, received[t] / 1000 - from_b[t]]))
rows.sort(key=lambda r: r[0])
# A record miscounted from a packet's size shifts every later match by one
# message; under `sync: always` (more batches of several records) this
# happens, and the split is then not to be read.
bad = sum(1 for r in rows if min(r[1]) < -1e-4)
if bad:
    print(f"warning: {bad} of {len(rows)} messages have a negative segment: the links' records and the messages do not line up")
names = ["client", "A", "hub", "B", "harness"]
print(f"{len(rows)} messages; p50 {rows[len(rows) // 2][0] * 1e3:.3f}, p99 {rows[int(len(rows) * 0.99)][0] * 1e3:.3f}, p99.9 {rows[int(len(rows) * 0.999)][0] * 1e3:.3f} ms")
med = [statistics.median(r[1][k] for r in rows) for k in range(5)]
print("median ms: " + ", ".join(f"{n} {m * 1e3:.3f}" for n, m in zip(names, med)))
for above in (0.5, 0.8, 1.2):
    slow = [r for r in rows if r[0] * 1e3 > above]
    if not slow:
        continue
    mean = [statistics.mean(r[1][k] for r in slow) for k in range(5)]
    largest = collections.Counter(names[max(range(5), key=lambda k: r[1][k] - med[k])] for r in slow)
    print(f"above {above} ms: {len(slow)} ({len(slow) / len(rows) * 100:.2f}%); mean ms " + ", ".join(f"{n} {m * 1e3:.3f}" for n, m in zip(names, mean)) + "; largest " + ", ".join(f"{n} {largest[n]}" for n in names))
