"""Reference quantizers / dequantizers and raw writers (safetensors, GGUF v3), numpy only.

Q8_0 / Q4_0 follow the ggml reference formulas as written by candle (architecture §6.1); MLX affine
packing/dequantisation follows architecture §6.2 (quantisation uses the simple min/max scheme:
bias = w_min, scale = (w_max - w_min) / (2^bits - 1), both rounded to bf16 before computing codes).
"""
import json
import struct

import numpy as np
import torch

QK = 32
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8


def round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def q8_0_quantize(x: np.ndarray) -> bytes:
    """x f32 [..., n], n % 32 == 0 -> bytes of blocks (d f16 LE, 32 x i8)."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    amax = np.abs(x).max(axis=1).astype(np.float32)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = round_half_away((x * idv[:, None]).astype(np.float32)).astype(np.int8)
    out = bytearray()
    for i in range(x.shape[0]):
        out += np.float16(d[i]).astype("<f2").tobytes()
        out += q[i].tobytes()
    return bytes(out)


def q8_0_dequantize(b: bytes, n: int) -> np.ndarray:
    a = np.frombuffer(b, dtype=np.uint8).reshape(-1, 34)
    d = a[:, :2].copy().view("<f2").astype(np.float32)
    q = a[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(-1)[:n]


def q4_0_quantize(x: np.ndarray) -> bytes:
    """ggml quantize_row_q4_0_ref: d = max / -8 (max = signed value of largest magnitude, first on ties),
    q = min(15, int(x/d + 8.5)) (truncation toward zero of a non-negative value); low nibble = element j,
    high nibble = element j + 16."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    out = bytearray()
    for blk in x:
        idx = int(np.argmax(np.abs(blk)))  # first maximum, like the strict '>' loop in ggml
        mx = blk[idx]
        d = np.float32(mx / np.float32(-8.0))
        idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        v = (blk * idv + np.float32(8.5)).astype(np.float32)
        q = np.minimum(15, v.astype(np.int8).astype(np.int32))  # C cast to int8 truncates
        lo, hi = q[:16], q[16:]
        out += np.float16(d).astype("<f2").tobytes()
        out += (lo | (hi << 4)).astype(np.uint8).tobytes()
    return bytes(out)


def q4_0_dequantize(b: bytes, n: int) -> np.ndarray:
    a = np.frombuffer(b, dtype=np.uint8).reshape(-1, 18)
    d = a[:, :2].copy().view("<f2").astype(np.float32)
    qs = a[:, 2:]
    lo = (qs & 0x0F).astype(np.int32) - 8
    hi = (qs >> 4).astype(np.int32) - 8
    q = np.concatenate([lo, hi], axis=1).astype(np.float32)
    return (q * d).reshape(-1)[:n]


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 (as uint16 bit patterns), via torch."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def mlx_quantize(w: np.ndarray, bits: int, group: int):
    """w f32 [rows, cols] -> (packed u32 [rows, cols*bits/32], scales bf16 bits, biases bf16 bits)."""
    rows, cols = w.shape
    assert cols % group == 0 and (cols * bits) % 32 == 0
    g = w.reshape(rows, cols // group, group).astype(np.float32)
    wmin, wmax = g.min(-1), g.max(-1)
    nb = (1 << bits) - 1
    scale = np.maximum((wmax - wmin) / np.float32(nb), np.float32(1e-7)).astype(np.float32)
    sb, bb = to_bf16_bits(scale), to_bf16_bits(wmin)
    s32, b32 = bf16_bits_to_f32(sb), bf16_bits_to_f32(bb)
    q = np.clip(np.rint((g - b32[..., None]) / s32[..., None]), 0, nb).astype(np.uint32).reshape(rows, cols)
    per = 32 // bits
    qq = q.reshape(rows, cols // per, per)
    packed = np.zeros((rows, cols // per), dtype=np.uint32)
    for j in range(per):
        packed |= qq[:, :, j] << np.uint32(bits * j)
    return packed, sb, bb


def mlx_dequantize(packed: np.ndarray, sb: np.ndarray, bb: np.ndarray, bits: int, group: int) -> np.ndarray:
    """Reference: w = scale * q + bias in f32 (scale/bias from bf16)."""
    rows = packed.shape[0]
    per = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    q = np.stack([(packed >> np.uint32(bits * j)) & mask for j in range(per)], axis=-1).reshape(rows, -1)
    cols = q.shape[1]
    s = np.repeat(bf16_bits_to_f32(sb), group, axis=1)
    b = np.repeat(bf16_bits_to_f32(bb), group, axis=1)
    assert s.shape == (rows, cols)
    return (s * q.astype(np.float32) + b).astype(np.float32)


# ---------------------------------------------------------------- raw safetensors writer
_ST_DT = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "U32": ("<u4", 4), "I64": ("<i8", 8),
          "U8": ("u1", 1), "I8": ("i1", 1), "I32": ("<i4", 4)}


def write_safetensors(path, tensors: dict, metadata: dict | None = None):
    """tensors: name -> (dtype string, shape, numpy array with matching itemsize)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = None   # placeholder: keeps __metadata__ first in the JSON header
    # Like the safetensors library: larger element sizes first, then by name, so that every tensor's data
    # is aligned to its element size (given the 8-byte padded header).
    for name in sorted(tensors, key=lambda n: (-_ST_DT[tensors[n][0]][1], n)):
        dt, shape, arr = tensors[name]
        npdt, _ = _ST_DT[dt]
        data = np.ascontiguousarray(arr).astype(npdt, copy=False).tobytes()
        assert len(data) == int(np.prod(shape, dtype=np.int64)) * _ST_DT[dt][1], name
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = {k: str(metadata[k]) for k in sorted(metadata)}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- GGUF v3 writer
GGUF_T = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "arr": 9,
          "u64": 10, "i64": 11, "f64": 12}
_GGUF_FMT = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i", "f32": "<f",
             "bool": "<?", "u64": "<Q", "i64": "<q", "f64": "<d"}


def _gstr(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _gval(kind: str, v) -> bytes:
    if kind == "str":
        return _gstr(v)
    if kind.startswith("arr:"):
        sub = kind[4:]
        out = struct.pack("<I", GGUF_T[sub]) + struct.pack("<Q", len(v))
        for x in v:
            out += _gval(sub, x)
        return out
    return struct.pack(_GGUF_FMT[kind], v)


def write_gguf(path, tensors: list, metadata: list | None = None, alignment: int = 32):
    """tensors: list of (name, ggml_type, shape (row-major, outermost first), data bytes).
    metadata: list of (key, kind, value) with kind in GGUF_T names or 'arr:<kind>'.
    Dims are written innermost first; each tensor's data is padded to `alignment`."""
    metadata = metadata or []
    out = bytearray()
    out += struct.pack("<I", 0x46554747) + struct.pack("<I", 3)
    out += struct.pack("<Q", len(tensors)) + struct.pack("<Q", len(metadata))
    for key, kind, v in metadata:
        out += _gstr(key)
        out += struct.pack("<I", GGUF_T["arr"] if kind.startswith("arr:") else GGUF_T[kind])
        out += _gval(kind, v)
    off = 0
    offsets = []
    for name, gt, shape, data in tensors:
        offsets.append(off)
        off += len(data)
        off += (alignment - off % alignment) % alignment
    for (name, gt, shape, data), o in zip(tensors, offsets):
        out += _gstr(name)
        out += struct.pack("<I", len(shape))
        for d in reversed(shape):
            out += struct.pack("<Q", d)
        out += struct.pack("<I", gt) + struct.pack("<Q", o)
    out += b"\x00" * ((alignment - len(out) % alignment) % alignment)
    for (name, gt, shape, data), o in zip(tensors, offsets):
        out += data
        out += b"\x00" * ((alignment - len(data) % alignment) % alignment)
    with open(path, "wb") as f:
        f.write(bytes(out))


def read_gguf(path):
    """Minimal reader used to self-check the writer: returns (metadata dict, {name: (type, shape, bytes)})."""
    b = open(path, "rb").read()
    pos = 0

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, b, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def rstr():
        nonlocal pos
        n = rd("<Q")
        s = b[pos:pos + n].decode()
        pos += n
        return s
    inv = {v: k for k, v in GGUF_T.items()}

    def rval(t):
        k = inv[t]
        if k == "str":
            return rstr()
        if k == "arr":
            st = rd("<I")
            n = rd("<Q")
            return [rval(st) for _ in range(n)]
        return rd(_GGUF_FMT[k])
    assert rd("<I") == 0x46554747
    ver = rd("<I")
    nt, nm = rd("<Q"), rd("<Q")
    md = {}
    for _ in range(nm):
        k = rstr()
        md[k] = rval(rd("<I"))
    infos = []
    for _ in range(nt):
        name = rstr()
        nd = rd("<I")
        dims = [rd("<Q") for _ in range(nd)]
        gt = rd("<I")
        o = rd("<Q")
        infos.append((name, gt, list(reversed(dims)), o))
    align = md.get("general.alignment", 32)
    data_start = pos + (align - pos % align) % align
    sizes = {GGML_F32: lambda n: 4 * n, GGML_F16: lambda n: 2 * n, GGML_Q8_0: lambda n: n // 32 * 34,
             GGML_Q4_0: lambda n: n // 32 * 18}
    tens = {}
    for name, gt, shape, o in infos:
        n = int(np.prod(shape))
        tens[name] = (gt, shape, b[data_start + o: data_start + o + sizes[gt](n)])
    return ver, md, tens
