#!/usr/bin/env python3
"""Summarise the log of tools/bench/compare.sh.

For every (what, threads, KV position) and implementation (ours per weight source and KV element
type, candle, torch): the median over rounds of each round's median ms, and the min-max of those.
For each of our rows, the speed-up over each baseline (baseline_ms / ours_ms) from the overall
medians and as the median (min-max) of per-round paired ratios, which cancels slow drift of the
shared machine's load. For our LM rows also the ratio to the roofline (frame ms / ((weight bytes +
KV bytes) / read-probe GB/s of the same round)); for candle's LM rows the same ratio when
compare.sh ran with --probe (probe measured right before the candle process, weight bytes and f32
KV bytes of the same position taken from our rows of the q8 bundle, which is the file candle reads).
Reads `result ...` (ours) and `median ...` (baselines) lines that the driver tagged with
`round_tag=R`; LM lines carry `pos=P` (Mimi lines have none: position "-"; LM lines without it,
from older logs, count as position 0).
Standard library only."""
import re
import statistics
import sys
from collections import defaultdict

KV = re.compile(r"(\w+)=(\S+)")
BASELINES = ("candle", "torch")


def fmt_ratio(xs):
    return f"{statistics.median(xs):.2f}× ({min(xs):.2f}–{max(xs):.2f})"


def main(path):
    per = defaultdict(dict)  # (what, threads, pos, impl) -> {round: ms}
    roof = defaultdict(list)  # (what, threads, pos, impl) -> [ratio to roofline]
    probe = {}  # (threads, round) -> GB/s measured right before candle's LM process
    bytes_at = {}  # (pos, kv) -> (weight GB, KV GB) per frame of our q8 bundle rows
    kv_types = set()
    simd_types = set()
    lines = []
    for line in open(path):
        if not (line.startswith("result ") or line.startswith("median ")):
            continue
        kv = dict(KV.findall(line))
        if "round_tag" not in kv:
            continue
        if kv.get("impl") == "candle_probe" and "gbps" in kv:
            probe[(int(kv["threads"]), int(kv["round_tag"]))] = float(kv["gbps"])
            continue
        if "ms" not in kv:
            continue
        lines.append(kv)
        if kv["impl"] == "ours" and "simd" in kv:
            simd_types.add(kv["simd"])
        if kv["impl"] == "ours" and "kv" in kv:
            kv_types.add(kv["kv"])
            if kv.get("format", "").startswith("bundle:") and "weight_gb" in kv and "kv_gb" in kv:
                # (Same bytes with --ab-avx512: both simd rows report them.)
                bytes_at[(kv.get("pos", "-"), kv["kv"])] = (float(kv["weight_gb"]), float(kv["kv_gb"]))
    for kv in lines:
        impl = kv["impl"]
        if impl == "ours" and "format" in kv:
            impl = f"ours[{kv['format'].replace('bundle:', '')}"
            impl += f", {kv['kv']} KV" if "kv" in kv and len(kv_types) > 1 else ""
            # `moshi-native bench lm --ab-avx512` times each cell with AVX-512 allowed and forbidden.
            impl += f", {kv['simd']}" if "simd" in kv and len(simd_types) > 1 else ""
            impl += "]"
        # Older candle logs had no pos on LM lines: their frames ran at positions 0-8.
        pos = kv.get("pos", "0" if kv["what"] == "lm_frame" else "-")
        key = (kv["what"], int(kv["threads"]), pos, impl)
        rnd = int(kv["round_tag"])
        per[key][rnd] = float(kv["ms"])
        if "ratio" in kv:
            roof[key].append(float(kv["ratio"]))
        elif impl == "candle" and kv["what"] == "lm_frame":
            gbps = probe.get((int(kv["threads"]), rnd))
            # candle's cache holds f32 K/V; our f32 rows give those bytes (bf16 ones: twice theirs).
            wk = bytes_at.get((pos, "f32"))
            if wk is None and (pos, "bf16") in bytes_at:
                w, k = bytes_at[(pos, "bf16")]
                wk = (w, 2 * k)
            if gbps and wk:
                roof[key].append(float(kv["ms"]) / ((wk[0] + wk[1]) / gbps * 1e3))

    def pos_order(p):
        return (0, int(p)) if p.isdigit() else (1, 0)

    groups = sorted({(w, t, p) for (w, t, p, _) in per}, key=lambda g: (g[0], g[1], pos_order(g[2])))
    head = "| what | threads | KV pos | implementation | median ms | min–max over rounds | rounds | ratio to roofline | "
    head += " | ".join(f"speed-up vs {b}: overall; paired per round" for b in BASELINES)
    print(head + " |")
    print("|" + "---|" * (8 + len(BASELINES)))
    for w, t, p in groups:
        impls = sorted(i for (w2, t2, p2, i) in per if (w2, t2, p2) == (w, t, p))
        for impl in impls:
            vals = per[(w, t, p, impl)]
            ms = list(vals.values())
            med = statistics.median(ms)
            r = roof.get((w, t, p, impl))
            cells = []
            for b in BASELINES:
                base = per.get((w, t, p, b))
                if not impl.startswith("ours") or not base:
                    cells.append("")
                    continue
                overall = statistics.median(base.values()) / med
                paired = [base[k] / vals[k] for k in vals if k in base]
                cells.append(f"{overall:.2f}×; {fmt_ratio(paired)}" if paired else f"{overall:.2f}×")
            print(f"| {w} | {t} | {p} | {impl} | {med:.1f} | {min(ms):.1f}–{max(ms):.1f} | {len(ms)} | "
                  f"{fmt_ratio(r) if r else ''} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
