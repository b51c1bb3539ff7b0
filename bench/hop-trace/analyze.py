#!/usr/bin/env python3
"""Hop-by-hop latency of the traced two-hop run (bench/hop-trace/run.sh).

Reads <dir>/harness.txt (the subscriber's receipt of every message of the
measured window) and one <pid>.txt per agent, tells the agents apart by
the stages they recorded (A reads MQTT, the hub forwards, B does neither),
and prints for each stage the cumulative latency from the publish and the
step from the stage before (p50, p99, max, how many over 1 ms), then which
step was the largest for the messages at or above the end-to-end p99.
"""
import collections
import glob
import sys

d = sys.argv[1]
harness = {}
for line in open(f"{d}/harness.txt"):
    p = line.split()
    if len(p) == 3:
        harness[p[0]] = float(p[2])
agents = {}
for f in glob.glob(f"{d}/*.txt"):
    if f.endswith("harness.txt"):
        continue
    times = collections.defaultdict(dict)
    stages = set()
    for line in open(f):
        p = line.split()
        if len(p) != 3 or p[0] not in harness:
            continue
        # The first time a stage saw the message (a write may carry it twice: a retry).
        if p[1] not in times[p[0]]:
            times[p[0]][p[1]] = float(p[2])
            stages.add(p[1])
    role = "A" if "mqtt_in" in stages else ("H" if "fwd" in stages else "B")
    agents[role] = times
SEQ = [("A", "mqtt_in"), ("A", "stored"), ("A", "fwd"), ("A", "write"),
       ("H", "sockin"), ("H", "recv"), ("H", "pump"), ("H", "rstored"), ("H", "fwd"), ("H", "write"),
       ("B", "sockin"), ("B", "recv"), ("B", "pump"), ("B", "rstored"), ("B", "write")]
names = [f"{a}.{s}" for a, s in SEQ] + ["subscriber"]
rows = []
for t, got in harness.items():
    sent = float(t)
    r = []
    for role, stage in SEQ:
        v = agents.get(role, {}).get(t, {}).get(stage)
        if v is None:
            break
        r.append(v - sent)
    else:
        r.append(got - sent)
        rows.append(r)


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


print(f"{len(harness)} messages, {len(rows)} seen at every stage")
if not rows:
    sys.exit(1)
print(f"{'stage':12} {'cum p50':>8} {'cum p99':>8} | {'step p50':>8} {'step p99':>8} {'step max':>8} {'>1 ms':>6}  (ms)")
for i, n in enumerate(names):
    cum = [r[i] for r in rows]
    step = [r[i] - (r[i - 1] if i else 0) for r in rows]
    print(f"{n:12} {q(cum, .5):8.3f} {q(cum, .99):8.3f} | {q(step, .5):8.3f} {q(step, .99):8.3f} {max(step):8.3f} {sum(x > 1 for x in step):6}")
thr = q([r[-1] for r in rows], .99)
tail = [r for r in rows if r[-1] >= thr]
largest = collections.Counter()
for r in tail:
    steps = [r[i] - (r[i - 1] if i else 0) for i in range(len(r))]
    largest[names[max(range(len(steps)), key=steps.__getitem__)]] += 1
print(f"{len(tail)} messages at or above the p99 ({thr:.2f} ms); their largest step:")
for n, c in largest.most_common():
    print(f"  {n:12} {c}")
