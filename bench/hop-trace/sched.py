#!/usr/bin/env python3
"""What the messages of the two-hop tail waited for, by the scheduler: for
each message at or above the end-to-end p99 of a traced run
(bench/hop-trace/run.sh), its largest step, and, over that step, how long
the agent that took the next stage had its main thread running and how
long runnable but not running; and which threads ran on the cores
meanwhile. Needs the trace directory and `perf sched timehist` of a
`perf sched record -k mono -a` made during the run (run.sh does both with
HOP_TRACE_SCHED=1).

    python3 bench/hop-trace/sched.py <trace dir> <timehist output>
"""
import collections
import glob
import re
import sys
import time

tracedir, timehist = sys.argv[1], sys.argv[2]
# The trace stamps are wall-clock ms; perf's are CLOCK_MONOTONIC seconds.
off = time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)
# trace
harness = {}
for l in open(f"{tracedir}/harness.txt"):
    p = l.split()
    if len(p) == 3: harness[p[0]] = float(p[2])
agents = {}
for f in glob.glob(f"{tracedir}/[0-9]*.txt"):
    pid = int(f.split("/")[-1][:-4])
    times = collections.defaultdict(dict); stages = set()
    for l in open(f):
        p = l.split()
        if len(p) == 3 and p[0] in harness and p[1] not in times[p[0]]:
            times[p[0]][p[1]] = float(p[2]); stages.add(p[1])
    role = "A" if "mqtt_in" in stages else ("H" if "fwd" in stages else "B")
    agents[role] = (pid, times)
SEQ = [("A","mqtt_in"),("A","stored"),("A","fwd"),("A","write"),("H","sockin"),("H","recv"),("H","pump"),("H","rstored"),("H","fwd"),("H","write"),("B","sockin"),("B","recv"),("B","pump"),("B","rstored"),("B","write")]
# sched
runs = collections.defaultdict(list)   # tid -> [(start,end)]
waits = collections.defaultdict(list)  # tid -> runnable intervals
names = {}
rx = re.compile(r"^\s*([\d.]+)\s+\[(\d+)\]\s+(.*?)\[(\d+)(?:/(\d+))?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
for l in open(timehist):
    m = rx.match(l)
    if not m: continue
    t = float(m.group(1)); name = m.group(3).strip(); tid = int(m.group(4)); pid = int(m.group(5) or m.group(4))
    wait, sch, run = float(m.group(6))/1e3, float(m.group(7))/1e3, float(m.group(8))/1e3
    names[tid] = (name, pid)
    runs[tid].append((t - run, t))
    if sch > 0: waits[tid].append((t - run - sch, t - run))
def overlap(iv, a, b):
    return sum(max(0, min(e, b) - max(s, a)) for s, e in iv)
pidrole = {pid: r for r, (pid, _) in agents.items()}
def who(tid):
    n, pid = names.get(tid, ("?", tid))
    if pid in pidrole: return f"{pidrole[pid]}:{'main' if tid == pid else n}"
    return n.split(":")[0][:18]
lat = sorted((harness[k] - float(k), k) for k in harness)
p99 = lat[int(len(lat) * 0.99)][0]
tail = [k for l, k in lat if l >= p99]
agg = collections.Counter(); stepcount = collections.Counter()
others = collections.Counter()
rows = []
for k in tail:
    chain = [(f"{r}.{s}", agents[r][1][k].get(s)) for r, s in SEQ] + [("subscriber", harness[k])]
    prev = ("publish", float(k)); best = None
    for name, t in chain:
        if t is None: continue
        d = t - prev[1]
        if best is None or d > best[0]: best = (d, prev, (name, t))
        prev = (name, t)
    d, (pn, pt), (sn, st) = best
    role = sn.split(".")[0]
    if role == "subscriber": tid = None
    else: tid = agents[role][0]
    a, b = pt / 1e3 - off, st / 1e3 - off
    stepcount[sn] += 1
    if tid is None: continue
    run = overlap(runs[tid], a, b); wait = overlap(waits[tid], a, b)
    rows.append((sn, d, run * 1e3, wait * 1e3))
    agg[(sn, "run")] += run * 1e3; agg[(sn, "runnable")] += wait * 1e3; agg[(sn, "step")] += d
    # who ran on the cpus while it was runnable
    for ws, we in waits[tid]:
        s2, e2 = max(ws, a), min(we, b)
        if e2 <= s2: continue
        for otid, iv in runs.items():
            o = overlap(iv, s2, e2)
            if o > 0 and otid != tid: others[who(otid)] += o * 1e3
print(f"p99 {p99:.3f} ms; {len(tail)} tail messages; largest step: {dict(stepcount.most_common())}")
for sn in [s for s, _ in stepcount.most_common()]:
    if agg[(sn, 'step')] == 0: continue
    print(f"{sn:12s} step total {agg[(sn,'step')]:.1f} ms: its main thread running {agg[(sn,'run')]:.1f} ms, runnable but not running {agg[(sn,'runnable')]:.1f} ms")
print("while the waiting agent's thread was runnable, the cores ran (ms):")
for n, v in others.most_common(15): print(f"  {n:24s} {v:.1f}")
