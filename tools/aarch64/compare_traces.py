#!/usr/bin/env python3
"""Compares two safetensors trace files (e.g. `moshi-native trace ...` on x86_64 and under qemu on
aarch64): integer tensors (tokens, codes) must be identical, float tensors within an absolute
tolerance (default 1e-4). Standard library only. Exit status 1 on any difference."""
import json
import struct
import sys

FMT = {"F32": "f", "F64": "d", "I64": "q", "I32": "i", "U32": "I", "I16": "h", "U16": "H",
       "I8": "b", "U8": "B", "BOOL": "?"}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        code = FMT.get(info["dtype"])
        if code is None:
            out[name] = (info["dtype"], data[a:b])
            continue
        count = (b - a) // struct.calcsize(code)
        out[name] = (info["dtype"], struct.unpack("<%d%s" % (count, code), data[a:b]))
    return out


def main():
    a_path, b_path = sys.argv[1], sys.argv[2]
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    a, b = read(a_path), read(b_path)
    bad = 0
    if sorted(a) != sorted(b):
        print("tensor names differ:", sorted(set(a) ^ set(b)))
        bad += 1
    worst = 0.0
    for name in sorted(set(a) & set(b)):
        (da, va), (db, vb) = a[name], b[name]
        if da != db or len(va) != len(vb):
            print(f"{name}: dtype/size {da}/{len(va)} vs {db}/{len(vb)}")
            bad += 1
        elif da in ("F32", "F64"):
            diff = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
            worst = max(worst, diff)
            if not diff <= tol:
                print(f"{name}: max |diff| {diff:.3g} > {tol}")
                bad += 1
        elif va != vb:
            n = sum(x != y for x, y in zip(va, vb))
            print(f"{name}: {n} of {len(va)} values differ")
            bad += 1
    print(f"{a_path} vs {b_path}: {len(a)} tensors, max float |diff| {worst:.3g}, "
          f"{'OK' if bad == 0 else str(bad) + ' mismatches'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
