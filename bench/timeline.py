#!/usr/bin/env python3
"""Reads SWITCHBOARD_GPU_TIMELINE stamps (kernels from bench/gpu_timeline.sh): each dispatch's
workgroups' start and end on the device clock, steps split at idle gaps (the host's syncs).
Prints one step's dispatches in order -- when the first and last workgroup started, when the
last ended, the gap since the previous dispatch's last end (negative: overlapped) -- and, over
every step shaped like it, the median of each column; then, per kernel, the medians over its
dispatches in those steps.
Usage: bench/timeline.py STAMPS IDS [--step N | --longest] [--gap-us 30]   (IDS: the
timeline_ids.txt of the bench/gpu_timeline.sh run whose kernels wrote STAMPS -- kernel ids change
with the kernel list; N: which step, negative from the end, default -2: a decode step before the
last; --longest: the step of the longest span, e.g. a long prompt's prefill)"""
import argparse
import statistics
import struct
import sys
from collections import defaultdict


def load(path, ids_path):
    names = {}
    for line in open(ids_path):
        k, n = line.split()
        names[int(k)] = n
    data = open(path, "rb").read()
    w = struct.unpack(f"<{len(data) // 4}I", data)
    n = min(w[0], (len(w) - 8) // 8)
    if w[0] > n:
        print(f"timeline: {w[0] - n} of {w[0]} stamps did not fit the buffer", file=sys.stderr)
    recs = []
    for i in range(n):
        r = w[8 + 8 * i:16 + 8 * i]
        recs.append((r[0] & 0xFFFF, r[0] >> 16, r[1], r[2], (r[4] << 32 | r[3])))
    return names, recs


def dispatches(recs):
    """[(kid, nwg, starts{wg: t}, ends{wg: t})] in start order: a kernel's starts split where a
    workgroup repeats, the count changes or the dispatch is complete."""
    by_kid = defaultdict(lambda: ([], []))
    for kid, phase, wg, nwg, t in recs:
        by_kid[kid][phase].append((t, wg, nwg))
    out = []
    for kid, (starts, ends) in by_kid.items():
        starts.sort()
        ends.sort()
        groups = []
        for t, wg, nwg in starts:
            g = groups[-1] if groups else None
            if g is None or g[1] != nwg or wg in g[2] or len(g[2]) == nwg:
                g = (kid, nwg, {}, {})
                groups.append(g)
            g[2][wg] = t
        # each end goes to the latest dispatch of its workgroup that started before it
        open_by_wg = defaultdict(list)
        for g in groups:
            for wg, t in g[2].items():
                open_by_wg[wg].append((t, g))
        for t, wg, _ in ends:
            cands = [g for ts, g in open_by_wg[wg] if ts <= t and wg not in g[3]]
            if cands:
                cands[0][3][wg] = t
        out += groups
    out.sort(key=lambda g: min(g[2].values()))
    return out


def steps(ds, gap_ns):
    cur, last_end, res = [], None, []
    for d in ds:
        s = min(d[2].values())
        if cur and s - last_end > gap_ns:
            res.append(cur)
            cur = []
        cur.append(d)
        e = max(d[3].values()) if d[3] else s
        last_end = e if len(cur) == 1 else max(last_end, e)
    if cur:
        res.append(cur)
    return res


def rows(step):
    t0 = min(step[0][2].values())
    prev_end, out = None, []
    for kid, nwg, st, en in step:
        s0, s1 = min(st.values()), max(st.values())
        e1 = max(en.values()) if en else s1
        out.append((kid, nwg, (s0 - t0) / 1e3, (s1 - s0) / 1e3, (e1 - s0) / 1e3,
                    None if prev_end is None else (s0 - prev_end) / 1e3))
        prev_end = e1 if prev_end is None else max(prev_end, e1)
    return out, (prev_end - t0) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stamps")
    ap.add_argument("ids")
    ap.add_argument("--step", type=int, default=-2)
    ap.add_argument("--longest", action="store_true")
    ap.add_argument("--gap-us", type=float, default=30.0)
    a = ap.parse_args()
    names, recs = load(a.stamps, a.ids)
    st = steps(dispatches(recs), a.gap_us * 1e3)
    print(f"{len(recs)} stamps, {len(st)} steps; dispatches a step: {[len(s) for s in st][:6]} ... {[len(s) for s in st][-6:]}")
    if a.longest:
        a.step = max(range(len(st)), key=lambda i: rows(st[i])[1])
    one, span = rows(st[a.step])
    shape = [r[:2] for r in one]
    alike = [rows(s)[0] for s in st if [r[:2] for r in rows(s)[0]] == shape]
    spans = [rows(s)[1] for s in st if [r[:2] for r in rows(s)[0]] == shape]
    print(f"step {a.step}: {len(one)} dispatches, {span:.1f} us first start to last end; {len(alike)} steps alike, "
          f"median span {statistics.median(spans):.1f} us")
    print(f"{'#':>3} {'kernel':34} {'wgs':>5} {'start':>8} {'launch':>7} {'dur':>7} {'gap':>6}   (us; medians over alike steps)")
    for i, r in enumerate(one):
        col = lambda j: statistics.median(x[i][j] for x in alike if x[i][j] is not None) if i or j != 5 else float("nan")
        print(f"{i:3} {names.get(r[0], r[0]):34} {r[1]:5} {col(2):8.2f} {col(3):7.2f} {col(4):7.2f} {col(5):6.2f}")
    per = defaultdict(list)
    for x in alike:
        for r in x[1:]:
            per[names.get(r[0], r[0])].append(r)
    print(f"{'kernel':38} {'n':>4} {'launch':>7} {'dur':>7} {'gap':>6}   (medians over its dispatches)")
    for k, rs in sorted(per.items(), key=lambda kv: -sum(r[4] for r in kv[1])):
        med = lambda j: statistics.median(r[j] for r in rs)
        print(f"{k:38} {len(rs):4} {med(3):7.2f} {med(4):7.2f} {med(5):6.2f}")


if __name__ == "__main__":
    main()
