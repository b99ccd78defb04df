#!/usr/bin/env python3
"""Per-kernel GPU time of one submission, from a run with SWITCHBOARD_OP_LOG=1 (every dispatch
timed alone between barriers, so the sums run above a real step's time; use them to rank kernels).

  SWITCHBOARD_OP_LOG=1 SWITCHBOARD_GPU_REPLAY=0 switchboard bench model --synthetic qwen3-30b-a3b \\
      --layers 4 --bits 4 --group-size 64 --prompt-len 64 --gen 4 --device vulkan 2> log.txt
  bench/kernel_profile.py log.txt            # the last decode step
  bench/kernel_profile.py --longest log.txt  # the longest submission
  bench/kernel_profile.py --list log.txt     # every submission: index, dispatches, us
  bench/kernel_profile.py --subs 12:16 log.txt  # submissions 12..15 together (a prefill is
                                                # recorded in slices of 8, 16, 32, 64, 128)
A kernel's first run at a new shape or specialization can take milliseconds in these logs:
rank kernels from a later prefill of the same length.
"""
import argparse
import collections
import re
import sys


def submissions(lines):
    """[(kernels [(name, us)], summary line)] in log order."""
    subs, cur = [], []
    for line in lines:
        m = re.search(r"\] gpu (\S+) ([0-9.]+) us on", line)
        if m:
            cur.append((m.group(1), float(m.group(2))))
        elif "gpu submission:" in line:
            subs.append((cur, line.split("] ")[-1].strip()))
            cur = []
    return subs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log", help="stderr of the run (SWITCHBOARD_OP_LOG=1)")
    ap.add_argument("--longest", action="store_true", help="the submission with the most kernel time")
    ap.add_argument("--min-dispatches", type=int, default=30, help="skip smaller submissions (probes, copies)")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--list", action="store_true", help="list every submission (index, dispatches, us)")
    ap.add_argument("--subs", help="A:B: submissions A..B-1 of --list together (no size filter)")
    a = ap.parse_args()
    with open(a.log, encoding="utf-8", errors="replace") as f:
        every = submissions(f.read().splitlines())
    if a.list:
        for i, (kernels, head) in enumerate(every):
            print(f"{i:4d} {len(kernels):5d} dispatches {sum(us for _, us in kernels):12.1f} us")
        return
    if a.subs:
        lo, hi = (int(v) for v in a.subs.split(":"))
        picked = every[lo:hi]
        if not picked:
            sys.exit(f"{a.log}: no submissions in {a.subs} (there are {len(every)})")
        kernels = [k for ks, _ in picked for k in ks]
        head = f"submissions {lo}..{lo + len(picked) - 1}: {len(kernels)} dispatches"
    else:
        subs = [s for s in every if len(s[0]) >= a.min_dispatches]
        if not subs:
            sys.exit(f"{a.log}: no submission of {a.min_dispatches}+ timed dispatches (was SWITCHBOARD_OP_LOG=1 set?)")
        kernels, head = max(subs, key=lambda s: sum(us for _, us in s[0])) if a.longest else subs[-1]
    agg = collections.OrderedDict()
    for name, us in kernels:
        n_us = agg.setdefault(name, [0, 0.0])
        n_us[0] += 1
        n_us[1] += us
    total = sum(us for _, us in agg.values())
    print(head)
    for name, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"  {name:30s} n={n:4d} {us:10.1f} us  {100 * us / total:5.1f}%")


if __name__ == "__main__":
    main()
