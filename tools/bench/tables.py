#!/usr/bin/env python3
"""Markdown tables from a `tools/bench/full-run.sh` log, in the layout of BENCHMARKS.md "Current figures".

    python3 tools/bench/tables.py LOG

Reads the `result impl=ours ...` lines of `moshi-native bench` (lm, mimi, duplex, batch), grouped by
the command printed before them (`$ ...` lines), and prints one table per kind with medians and
min–max as the bench computed them. The side-by-side summaries (compare.sh), the kernel tables and the
other outputs are already markdown or plain text in the log: copy them from there.
"""
import re
import sys


def parse(path):
    cmd = None
    rows = []
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("$ "):
            cmd = line[2:]
        elif line.startswith("result "):
            kv = dict(re.findall(r"(\w+)=(\S+)", line))
            kv["_cmd"] = cmd
            rows.append(kv)
    return rows


def f(x, nd=1):
    return f"{float(x):.{nd}f}"


def lm(rows):
    out = ["| format | KV | pos | threads | frame ms median (min–max) | weights + KV GB | probe GB/s | "
           "ratio to roofline median (min–max) |", "|---|---|---|---|---|---|---|---|"]
    sel = [r for r in rows if r.get("what") == "lm_frame" and r.get("impl") == "ours" and "--bundle" not in (r["_cmd"] or "")
           and "compare.sh" not in (r["_cmd"] or "")]
    for r in sel:
        gb = float(r["weight_gb"]) + float(r["kv_gb"])
        out.append(f"| {r['format']} | {r['kv']} | {r['pos']} | {r['threads']}{' ' + r['simd'] if 'simd' in r else ''} | "
                   f"{f(r['ms'], 0)} ({f(r['min'], 0)}–{f(r['max'], 0)}) | {gb:.2f} | {f(r['probe_gbps'])} | "
                   f"{f(r['ratio'], 2)} ({f(r['ratio_min'], 2)}–{f(r['ratio_max'], 2)}) |")
    out += ["", "| format | threads | pos | 4 sessions ms median (min–max) | ratio to 1 session, paired (min–max) |",
            "|---|---|---|---|---|"]
    for r in rows:
        if r.get("what") == "lm_batch":
            out.append(f"| {r['format']} | {r['threads']} | {r['pos']} | {f(r['ms'], 0)} ({f(r['min'], 0)}–{f(r['max'], 0)}) | "
                       f"{f(r['ratio_to_single'], 2)} ({f(r['ratio_min'], 2)}–{f(r['ratio_max'], 2)}) |")
    return out


def mimi(rows):
    out = ["| threads | kernels | encode ms | decode ms | encode+decode ms (p90) |", "|---|---|---|---|---|"]
    cells = {}
    for r in rows:
        if r.get("impl") == "ours" and r.get("what", "").startswith("mimi_") and "mimi" in (r["_cmd"] or "").split() \
                and "compare.sh" not in (r["_cmd"] or "") and "--bundle" not in (r["_cmd"] or ""):
            cells.setdefault((r["threads"], r.get("simd", "")), {})[r["what"]] = r
    for (t, simd), c in sorted(cells.items()):
        e, d, s = c.get("mimi_encode"), c.get("mimi_decode"), c.get("mimi_encdec")
        cell = lambda r: f"{f(r['ms'])} ({f(r['min'])}–{f(r['max'])})" if r else "—"
        out.append(f"| {t} | {simd.upper() or 'default'} | {cell(e)} | {cell(d)} | {cell(s)}; p90 {f(s['p90']) if s else '—'} |")
    return out


def duplex(rows):
    out = ["| bundle | threads | pass ms median (min–max) | LM alone | Mimi alone | parts | **overhead** median (min–max) | "
           "encode / LM / decode in the pass | resample / detok | page faults per pass |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("what") == "duplex_frame":
            out.append(f"| {r['format']} | {r['threads']} | {f(r['ms'])} ({f(r['min'])}–{f(r['max'])}) | {r['lm_alone_ms']} | "
                       f"{r['mimi_alone_ms']} | {r['parts_ms']} | **{r['overhead']}** ({r['overhead_min']}–{r['overhead_max']}) | "
                       f"{r['encode_ms']} / {r['lm_ms']} / {r['decode_ms']} | {r['resample_ms']} / {r['detok_ms']} | {r['pass_faults']} |")
    return out


def batch(rows):
    out = ["| what | threads | mode | ms median (min–max) | ratio to one (min–max) |", "|---|---|---|---|---|"]
    for r in rows:
        if r.get("what") in ("mimi_slots", "server_tick"):
            ratio = r.get("ratio_to_one", "")
            rr = f"{ratio} ({r.get('ratio_min', '')}–{r.get('ratio_max', '')})" if ratio else ""
            out.append(f"| {r['what']} ({r.get('slots', '')} slots) | {r['threads']} | {r.get('mode', '')} | "
                       f"{f(r['ms'])} ({f(r['min'])}–{f(r['max'])}) | {rr} |")
    return out


def batch_tick(path):
    """The runtime example's lines: `key=median [min-max]` pairs."""
    out = ["| format | threads | pos | single ms | tick, 1 active ms | tick, 4 active ms | 4 active ÷ single |",
           "|---|---|---|---|---|---|---|"]
    for line in open(path, encoding="utf-8", errors="replace"):
        if not line.startswith("result ") or "what=lm_batch_tick" not in line:
            continue
        kv = dict(re.findall(r"(\w+)=(\w+)", line))
        cell = {k: f"{m} ({a}–{b})" for k, m, a, b in re.findall(r"([\w/]+)=([\d.]+) \[([\d.]+)-([\d.]+)\]", line)}
        out.append(f"| {kv['format']} | {kv['threads']} | {kv['pos']} | {cell['single_ms']} | {cell['tick1_ms']} | "
                   f"{cell['tick4_ms']} | **{cell['tick4/single']}** |")
    return out


def main():
    rows = parse(sys.argv[1])
    for title, fn in [("LM frame", lm), ("Mimi", mimi), ("duplex", duplex), ("batch", batch)]:
        print(f"### {title}\n")
        print("\n".join(fn(rows)))
        print()
    print("### batch tick (runtime)\n")
    print("\n".join(batch_tick(sys.argv[1])))


if __name__ == "__main__":
    main()
