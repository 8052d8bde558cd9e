"""Crafted quantization blocks with their dequantized reference values (fixtures/quant/)."""
from common import FIX, write_json
import numpy as np
import quant as Q

OUT = FIX / "quant"


def crafted_rows(cols: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    rows = [
        np.zeros(cols),                                             # d = 0 -> id = 0
        np.linspace(-1.0, 1.0, cols),                               # ramp
        np.zeros(cols),                                             # exact .5 ties for q8 (set below)
        rng.standard_normal(cols) * 1e-6,                           # f16 subnormal scales
        rng.standard_normal(cols) * 3e3,                            # large values
        np.where(np.arange(cols) % 7 == 0, -2.5, 0.25),            # negative extreme (q4 sign rule)
        rng.standard_normal(cols),
        np.full(cols, 0.7),                                         # constant block
    ]
    x = np.stack(rows).astype(np.float32)
    # q8 ties: amax 127 -> d = 1, id = 1, so v = k + 0.5 rounds half away from zero; block 1 = block 0 / 2
    # (amax 63.5 -> d = 0.5, id = 2: same ties).
    j = np.arange(30)
    tie = np.concatenate([[127.0, -126.5], (j // 2 + 0.5) * np.where(j % 2 == 0, 1.0, -1.0)])
    x[2, :32] = tie
    x[2, 32:64] = tie / 2
    return x


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    cols = 64
    src = crafted_rows(cols)
    rng = np.random.default_rng(6)
    x = rng.standard_normal(cols).astype(np.float32)
    T = {"src": ("F32", src.shape, src), "x": ("F32", x.shape, x)}
    for name, qf, dq, bs in (("q8_0", Q.q8_0_quantize, Q.q8_0_dequantize, 34), ("q4_0", Q.q4_0_quantize, Q.q4_0_dequantize, 18)):
        raw = b"".join(qf(r) for r in src)
        arr = np.frombuffer(raw, dtype=np.uint8).reshape(src.shape[0], cols // 32 * bs)
        deq = np.stack([dq(qf(r), cols) for r in src]).astype(np.float32)
        y = (deq.astype(np.float64) @ x.astype(np.float64)).astype(np.float32)
        T[f"{name}.bytes"] = ("U8", arr.shape, arr)
        T[f"{name}.dequant"] = ("F32", deq.shape, deq)
        T[f"{name}.matvec_f64"] = ("F32", y.shape, y)
    # candle-style Q8_0 x Q8_0 dot product: activations quantized with the same Q8_0 rule, per block
    # sum_i32(qw*qx) * d_w * d_x, accumulated in f32 over blocks in order.
    xq = Q.q8_0_quantize(x)
    xa = np.frombuffer(xq, dtype=np.uint8).reshape(-1, 34)
    y = np.zeros(src.shape[0], dtype=np.float32)
    for r in range(src.shape[0]):
        wa = np.frombuffer(Q.q8_0_quantize(src[r]), dtype=np.uint8).reshape(-1, 34)
        acc = np.float32(0.0)
        for b in range(wa.shape[0]):
            dw = wa[b, :2].copy().view("<f2").astype(np.float32)[0]
            dx = xa[b, :2].copy().view("<f2").astype(np.float32)[0]
            s = int(np.dot(wa[b, 2:].copy().view(np.int8).astype(np.int32), xa[b, 2:].copy().view(np.int8).astype(np.int32)))
            acc = np.float32(acc + np.float32(np.float32(s) * dw * dx))
        y[r] = acc
    T["q8_0.matvec_q8act"] = ("F32", y.shape, y)
    T["x.q8_0_bytes"] = ("U8", (len(xq),), np.frombuffer(xq, dtype=np.uint8))

    # MLX affine, all four (bits, group) combinations on a [8, 128] source.
    srcm = np.concatenate([src, crafted_rows(cols)[:, ::-1]], axis=1).astype(np.float32)
    srcm_b = Q.bf16_bits_to_f32(Q.to_bf16_bits(srcm)).reshape(srcm.shape)
    xm = rng.standard_normal(srcm.shape[1]).astype(np.float32)
    T["mlx.src_bf16"] = ("BF16", srcm.shape, Q.to_bf16_bits(srcm))
    T["mlx.x"] = ("F32", xm.shape, xm)
    for bits in (4, 8):
        for group in (32, 64):
            p, sb, bb = Q.mlx_quantize(srcm_b, bits, group)
            deq = Q.mlx_dequantize(p, sb, bb, bits, group)
            k = f"mlx_q{bits}_g{group}"
            T[k + ".weight"] = ("U32", p.shape, p)
            T[k + ".scales"] = ("BF16", sb.shape, sb)
            T[k + ".biases"] = ("BF16", bb.shape, bb)
            T[k + ".dequant"] = ("F32", deq.shape, deq)
            T[k + ".matvec_f64"] = ("F32", (deq.shape[0],), (deq.astype(np.float64) @ xm.astype(np.float64)).astype(np.float32))
    # bf16 rounding probes (round-to-nearest-even, NaN/inf preserved)
    probes = np.array([1.0, 1.00390625, 1.01171875, -3.1415927, 1e-40, 3.4e38, np.inf, -0.0, 65504.0, 1.0 + 2 ** -8],
                      dtype=np.float32)
    T["bf16.probe_f32"] = ("F32", probes.shape, probes)
    T["bf16.probe_bits"] = ("BF16", probes.shape, Q.to_bf16_bits(probes))
    Q.write_safetensors(OUT / "blocks.safetensors", T, {"generator": "tools/oracle/gen_quant.py"})

    # A crafted GGUF v3 file: metadata of many kinds, general.alignment 64, F32/F16/Q8_0/Q4_0 tensors
    # including shapes that are not multiples of the alignment.
    f32a = rng.standard_normal((3, 5)).astype(np.float32)
    f16a = rng.standard_normal((2, 32)).astype(np.float16)
    r3 = rng.standard_normal((1, 1, 8)).astype(np.float32)
    q8 = src[4:8]
    q4 = src[5:7]
    tensors = [
        ("a.f32", Q.GGML_F32, [3, 5], f32a.astype("<f4").tobytes()),
        ("b.f16", Q.GGML_F16, [2, 32], f16a.astype("<f2").tobytes()),
        ("c.q8_0", Q.GGML_Q8_0, [4, 64], b"".join(Q.q8_0_quantize(r) for r in q8)),
        ("d.q4_0", Q.GGML_Q4_0, [2, 64], b"".join(Q.q4_0_quantize(r) for r in q4)),
        ("e.norm.alpha", Q.GGML_F32, [1, 1, 8], r3.astype("<f4").tobytes()),
    ]
    metadata = [
        ("general.architecture", "str", "moshi-test"),
        ("general.alignment", "u32", 64),
        ("test.u8", "u8", 200), ("test.i8", "i8", -5), ("test.u16", "u16", 65000), ("test.i16", "i16", -30000),
        ("test.i32", "i32", -123456), ("test.f32", "f32", 0.5), ("test.bool", "bool", True),
        ("test.u64", "u64", 2 ** 40 + 3), ("test.i64", "i64", -(2 ** 40)), ("test.f64", "f64", 0.125),
        ("test.arr_u32", "arr:u32", [1, 2, 3]), ("test.arr_str", "arr:str", ["a", "éb", ""]),
        ("test.utf8", "str", "moshi ✓"),
    ]
    Q.write_gguf(OUT / "crafted.gguf", tensors, metadata, alignment=64)
    ver, md, back = Q.read_gguf(OUT / "crafted.gguf")
    assert ver == 3 and md["general.alignment"] == 64
    for name, gt, shape, data in tensors:
        assert back[name] == (gt, shape, data), name
    exp = {
        "a.f32": ("F32", (3, 5), f32a),
        "b.f16": ("F32", (2, 32), f16a.astype(np.float32)),
        "c.q8_0": ("F32", (4, 64), np.stack([Q.q8_0_dequantize(Q.q8_0_quantize(r), 64) for r in q8])),
        "d.q4_0": ("F32", (2, 64), np.stack([Q.q4_0_dequantize(Q.q4_0_quantize(r), 64) for r in q4])),
        "e.norm.alpha": ("F32", (1, 1, 8), r3),
    }
    Q.write_safetensors(OUT / "crafted_gguf_expected.safetensors", exp)
    write_json(OUT / "crafted_gguf_metadata.json", {k: {"type": t, "value": v} for k, t, v in metadata})
    print("quant fixtures written")


if __name__ == "__main__":
    main()
