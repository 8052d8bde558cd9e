#!/usr/bin/env python3
"""Summarise the log of tools/bench/compare.sh: per (what, threads, impl) the median over rounds of
each round's median, the min-max of those, and ours/theirs ratios (speed-up = theirs_ms / ours_ms),
both from the overall medians and as the median of per-round paired ratios (robust to slow drift of
the machine's load). Reads `result ...` (ours) and `median ...` (baselines) lines tagged by the
driver with `round=R`. Standard library only."""
import re
import statistics
import sys
from collections import defaultdict

KV = re.compile(r"(\w+)=(\S+)")


def main(path):
    per = defaultdict(dict)  # (what, threads, impl) -> {round: ms}
    extra = {}
    for line in open(path):
        if not (line.startswith("result ") or line.startswith("median ")):
            continue
        kv = dict(KV.findall(line))
        if "ms" not in kv or "round_tag" not in kv:
            continue
        if kv.get("pos", "0") != "0":
            continue
        key = (kv["what"], int(kv["threads"]), kv["impl"])
        per[key][int(kv["round_tag"])] = float(kv["ms"])
        if kv["impl"] == "ours" and "roofline_ms" in kv:
            extra.setdefault(key, []).append((float(kv["roofline_ms"]), float(kv.get("ratio", "nan"))))
    rows = sorted(per)
    print("| what | threads | impl | median ms (over rounds) | min–max | rounds | ours faster by (overall) | paired per-round ratio median (min–max) |")
    print("|---|---|---|---|---|---|---|---|")
    for key in rows:
        what, th, impl = key
        vals = per[key]
        ms = list(vals.values())
        med = statistics.median(ms)
        cell = ""
        paired = ""
        if impl != "ours":
            ours = per.get((what, th, "ours"))
            if ours:
                cell = f"{med / statistics.median(ours.values()):.2f}×"
                pr = [vals[r] / ours[r] for r in vals if r in ours]
                if pr:
                    paired = f"{statistics.median(pr):.2f}× ({min(pr):.2f}–{max(pr):.2f})"
        print(f"| {what} | {th} | {impl} | {med:.1f} | {min(ms):.1f}–{max(ms):.1f} | {len(ms)} | {cell} | {paired} |")
    if extra:
        print()
        print("| what | threads | ours: roofline ms (median) | ours: ratio to roofline, median (min–max) |")
        print("|---|---|---|---|")
        for key, v in sorted(extra.items()):
            roofs = [r for r, _ in v]
            ratios = [q for _, q in v]
            print(f"| {key[0]} | {key[1]} | {statistics.median(roofs):.1f} | {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")


if __name__ == "__main__":
    main(sys.argv[1])
