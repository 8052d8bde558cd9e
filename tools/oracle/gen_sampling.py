"""Behaviour of moshi.utils.sampling.sample_token on fixed logits (deterministic parts only: argmax,
temperature 0, top-k 1, softmax with temperature, top-k selection). Seeded sampling is not reproducible
outside torch and is not dumped."""
from common import FIX, save_st, versions, write_json
import torch
from moshi.utils.sampling import sample_token

OUT = FIX / "sampling"


def main():
    g = torch.Generator().manual_seed(3)
    V = 16
    rows = [
        torch.randn(V, generator=g) * 3,
        torch.tensor([1.0, 5.0, 5.0, 2.0] + [0.0] * (V - 4)),                   # tie: first maximum wins
        torch.full((V,), -1.0),                                                # all equal -> index 0
        torch.tensor([-float("inf")] * (V - 1) + [-3.0]),                      # -inf everywhere but last
        torch.randn(V, generator=g) * 30 + 100,                                # large offsets
        torch.linspace(0, 1, V) * 1e-3,                                        # tiny gaps
    ]
    logits = torch.stack(rows).float()
    argmax = sample_token(logits, use_sampling=False)
    temp0 = sample_token(logits, use_sampling=True, temp=0.0, top_k=25)
    topk1 = torch.stack([sample_token(logits, use_sampling=True, temp=0.7, top_k=1) for _ in range(8)])
    assert torch.equal(argmax, temp0)
    probs = torch.softmax(logits / 0.7, dim=-1)
    top3_p, top3_i = torch.topk(probs, 3, dim=-1)
    save_st(OUT / "sample_token.safetensors", {
        "logits": logits, "argmax": argmax, "temp0_topk25": temp0, "topk1_temp07_8draws": topk1,
        "softmax_temp07": probs, "top3_probs_temp07": top3_p, "top3_index_temp07": top3_i,
    }, versions())
    write_json(OUT / "README.json", {"note": "sample_token(logits, use_sampling=False) == torch.argmax (first maximum on ties); "
                                             "use_sampling=True with temp <= 0 also falls back to argmax; top_k=1 returns the argmax "
                                             "whatever the RNG, EXCEPT on exact ties, where torch.topk's choice is not the first maximum "
                                             "(row 2, all equal: argmax 0, top_k=1 gives 10). top3_* = torch.topk(softmax(logits/0.7), 3) (sorted, not renormalised)."})
    print("argmax", argmax.tolist(), "topk1", topk1[0].tolist())


if __name__ == "__main__":
    main()
