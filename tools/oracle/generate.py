"""Regenerate every oracle fixture: `python generate.py [mimi] [lm] [exports] [quant] [duplex] [sampling] [stt]` (default all,
in this order; later groups read the earlier ones). `python seed_search.py [--write]` re-runs the LM seed search."""
import sys
import time

import common  # noqa: F401  (environment: NO_TORCH_COMPILE, 1 thread, offline)
import gen_duplex
import gen_exports
import gen_lm
import gen_mimi
import gen_quant
import gen_sampling
import gen_stt

STEPS = [("mimi", gen_mimi.main), ("lm", gen_lm.main), ("exports", gen_exports.main),
         ("quant", gen_quant.main), ("duplex", gen_duplex.main), ("sampling", gen_sampling.main), ("stt", gen_stt.main)]

if __name__ == "__main__":
    want = set(sys.argv[1:]) or {n for n, _ in STEPS}
    for name, fn in STEPS:
        if name in want:
            t = time.time()
            fn()
            print(f"[{name}] done in {time.time() - t:.1f}s", flush=True)
