#!/usr/bin/env python3
"""Summarise the log of tools/bench/compare.sh.

For every (what, threads) and implementation (ours per weight source, candle, torch): the median
over rounds of each round's median ms, and the min-max of those. For each of our rows, the speed-up
over each baseline (baseline_ms / ours_ms) from the overall medians and as the median (min-max) of
per-round paired ratios, which cancels slow drift of the shared machine's load. For our LM rows
also the ratio to the roofline (frame ms / (weight bytes / read-probe GB/s of the same round)).
Reads `result ...` (ours) and `median ...` (baselines) lines that the driver tagged with
`round_tag=R`. Standard library only."""
import re
import statistics
import sys
from collections import defaultdict

KV = re.compile(r"(\w+)=(\S+)")
BASELINES = ("candle", "torch")


def fmt_ratio(xs):
    return f"{statistics.median(xs):.2f}× ({min(xs):.2f}–{max(xs):.2f})"


def main(path):
    per = defaultdict(dict)  # (what, threads, impl) -> {round: ms}
    roof = defaultdict(list)  # (what, threads, impl) -> [ratio to roofline]
    for line in open(path):
        if not (line.startswith("result ") or line.startswith("median ")):
            continue
        kv = dict(KV.findall(line))
        if "ms" not in kv or "round_tag" not in kv or kv.get("pos", "0") != "0":
            continue
        impl = kv["impl"]
        if impl == "ours" and "format" in kv:
            impl = f"ours[{kv['format'].replace('bundle:', '')}]"
        key = (kv["what"], int(kv["threads"]), impl)
        per[key][int(kv["round_tag"])] = float(kv["ms"])
        if "ratio" in kv:
            roof[key].append(float(kv["ratio"]))
    groups = sorted({(w, t) for (w, t, _) in per})
    head = "| what | threads | implementation | median ms | min–max over rounds | rounds | ratio to roofline | "
    head += " | ".join(f"speed-up vs {b}: overall; paired per round" for b in BASELINES)
    print(head + " |")
    print("|" + "---|" * (7 + len(BASELINES)))
    for w, t in groups:
        impls = sorted(i for (w2, t2, i) in per if (w2, t2) == (w, t))
        for impl in impls:
            vals = per[(w, t, impl)]
            ms = list(vals.values())
            med = statistics.median(ms)
            r = roof.get((w, t, impl))
            cells = []
            for b in BASELINES:
                base = per.get((w, t, b))
                if not impl.startswith("ours") or not base:
                    cells.append("")
                    continue
                overall = statistics.median(base.values()) / med
                paired = [base[k] / vals[k] for k in vals if k in base]
                cells.append(f"{overall:.2f}×; {fmt_ratio(paired)}" if paired else f"{overall:.2f}×")
            print(f"| {w} | {t} | {impl} | {med:.1f} | {min(ms):.1f}–{max(ms):.1f} | {len(ms)} | "
                  f"{fmt_ratio(r) if r else ''} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
