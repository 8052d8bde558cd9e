//! GGUF v2/v3 reader (little-endian), written by hand over the mmapped bytes.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, metadata key/values,
//! tensor infos (name, u32 n_dims, u64 dims innermost-first, u32 GGML type, u64 offset relative to
//! the data section), then the data section at the next multiple of `general.alignment` (default 32).
//! Every count and length is checked against the bytes that remain before it is used, so a corrupt
//! header cannot make the reader allocate or loop in proportion to a claimed size.

use std::collections::{BTreeMap, HashSet};

use super::{check_overlaps, checked_size, CheckpointError, DType, Malformed, RawTensor};

/// GGUF magic (`b"GGUF"` read as little-endian u32).
pub const MAGIC: u32 = 0x4655_4747;
/// Default data alignment.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// GGML type ids.
pub mod ggml {
    /// f32.
    pub const F32: u32 = 0;
    /// f16.
    pub const F16: u32 = 1;
    /// Q4_0.
    pub const Q4_0: u32 = 2;
    /// Q8_0.
    pub const Q8_0: u32 = 8;
    /// bf16.
    pub const BF16: u32 = 30;

    /// Human-readable name of a GGML type id.
    pub fn name(t: u32) -> &'static str {
        match t {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16..=23 | 29 => "IQ*",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            30 => "BF16",
            _ => "unknown",
        }
    }
}

/// A metadata value (arrays are summarised, not stored).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Any integer type.
    Int(i128),
    /// f32/f64.
    Float(f64),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array: element type id and count.
    Array {
        /// GGUF value type of the elements.
        elem_type: u32,
        /// Number of elements.
        len: u64,
    },
}

/// A parsed, validated GGUF header.
#[derive(Debug, Clone)]
pub struct Header {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata key/values (strings and scalars; arrays summarised).
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensors in file order; shapes outermost-first, offsets absolute.
    pub tensors: Vec<RawTensor>,
    /// Data alignment.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: usize,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], Malformed> {
        let rem = (self.b.len() - self.pos) as u64;
        if n > rem {
            return Err(Malformed::Truncated {
                at: self.pos as u64,
                needed: n,
                len: self.b.len() as u64,
            });
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn string(&mut self) -> Result<String, Malformed> {
        let n = self.u64()?;
        let at = self.pos as u64 + 8;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| Malformed::NonUtf8Name { at })
    }
}

/// Size in bytes of a scalar GGUF value type, `None` for string/array.
fn scalar_size(t: u32) -> Option<u64> {
    match t {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

fn read_value(c: &mut Cursor<'_>, t: u32, depth: u32) -> Result<MetaValue, Malformed> {
    if let Some(sz) = scalar_size(t) {
        let b = c.take(sz)?;
        return Ok(match t {
            0 => MetaValue::Int(b[0] as i128),
            1 => MetaValue::Int(b[0] as i8 as i128),
            7 => MetaValue::Bool(b[0] != 0),
            2 => MetaValue::Int(u16::from_le_bytes([b[0], b[1]]) as i128),
            3 => MetaValue::Int(i16::from_le_bytes([b[0], b[1]]) as i128),
            4 => MetaValue::Int(u32::from_le_bytes(b.try_into().expect("4")) as i128),
            5 => MetaValue::Int(i32::from_le_bytes(b.try_into().expect("4")) as i128),
            6 => MetaValue::Float(f32::from_le_bytes(b.try_into().expect("4")) as f64),
            10 => MetaValue::Int(u64::from_le_bytes(b.try_into().expect("8")) as i128),
            11 => MetaValue::Int(i64::from_le_bytes(b.try_into().expect("8")) as i128),
            _ => MetaValue::Float(f64::from_le_bytes(b.try_into().expect("8"))),
        });
    }
    match t {
        8 => Ok(MetaValue::Str(c.string()?)),
        9 => {
            if depth > 3 {
                return Err(Malformed::Other("metadata arrays nested too deeply".into()));
            }
            let et = c.u32()?;
            let n = c.u64()?;
            if let Some(sz) = scalar_size(et) {
                let total = n.checked_mul(sz).ok_or(Malformed::Truncated {
                    at: c.pos as u64,
                    needed: u64::MAX,
                    len: c.b.len() as u64,
                })?;
                c.take(total)?;
            } else {
                // Each string/array element consumes at least 8 bytes, so this loop ends at EOF.
                for _ in 0..n {
                    read_value(c, et, depth + 1)?;
                }
            }
            Ok(MetaValue::Array {
                elem_type: et,
                len: n,
            })
        }
        _ => Err(Malformed::Other(format!("unknown metadata value type {t}"))),
    }
}

/// Error of [`parse`]: a malformed file or an unsupported tensor type.
#[derive(Debug)]
pub enum GgufError {
    /// Structurally invalid.
    Malformed(Malformed),
    /// Valid file, but a tensor of a GGML type this engine does not read.
    Unsupported {
        /// Tensor name.
        tensor: String,
        /// GGML type id.
        ggml_type: u32,
    },
}

impl From<Malformed> for GgufError {
    fn from(m: Malformed) -> Self {
        GgufError::Malformed(m)
    }
}

impl GgufError {
    /// Convert into a [`CheckpointError`] for `path`.
    pub fn into_checkpoint(self, path: &std::path::Path) -> CheckpointError {
        match self {
            GgufError::Malformed(kind) => CheckpointError::Malformed {
                path: path.to_path_buf(),
                kind,
            },
            GgufError::Unsupported { tensor, ggml_type } => CheckpointError::UnsupportedGgmlType {
                tensor,
                ggml_type,
                type_name: ggml::name(ggml_type),
            },
        }
    }
}

/// Parse and validate a GGUF file whose full contents are `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { b: bytes, pos: 0 };
    let magic = c.u32()?;
    if magic != MAGIC {
        return Err(Malformed::BadMagic { found: magic }.into());
    }
    let version = c.u32()?;
    if version != 2 && version != 3 {
        return Err(Malformed::UnsupportedVersion(version).into());
    }
    let n_tensors = c.u64()?;
    let n_kv = c.u64()?;
    let mut metadata = BTreeMap::new();
    // Each KV needs at least 8 (key len) + 4 (type) + 1 bytes: loops end at EOF on bogus counts.
    for _ in 0..n_kv {
        let key = c.string()?;
        let t = c.u32()?;
        let v = read_value(&mut c, t, 0)?;
        if metadata.insert(key.clone(), v).is_some() {
            return Err(Malformed::DuplicateName(key).into());
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::Int(a)) if *a > 0 && (*a as u64).is_power_of_two() && *a <= 1 << 20 => {
            *a as u64
        }
        Some(v) => return Err(Malformed::Other(format!("bad general.alignment {v:?}")).into()),
    };
    struct Info {
        name: String,
        dims: Vec<u64>,
        ty: u32,
        offset: u64,
    }
    let mut infos = Vec::new();
    let mut seen = HashSet::new();
    for _ in 0..n_tensors {
        let name = c.string()?;
        let nd = c.u32()?;
        if nd > 8 {
            return Err(Malformed::Other(format!("tensor `{name}`: {nd} dims")).into());
        }
        let mut dims = Vec::with_capacity(nd as usize);
        for _ in 0..nd {
            dims.push(c.u64()?);
        }
        let ty = c.u32()?;
        let offset = c.u64()?;
        if !seen.insert(name.clone()) {
            return Err(Malformed::DuplicateName(name).into());
        }
        infos.push(Info {
            name,
            dims,
            ty,
            offset,
        });
    }
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    if data_start > file_len {
        return Err(Malformed::Truncated {
            at: c.pos as u64,
            needed: data_start - c.pos as u64,
            len: file_len,
        }
        .into());
    }
    let data_len = file_len - data_start;
    let mut tensors = Vec::with_capacity(infos.len());
    for Info {
        name,
        dims,
        ty,
        offset,
    } in infos
    {
        let dtype = match ty {
            ggml::F32 => DType::F32,
            ggml::F16 => DType::F16,
            ggml::BF16 => DType::Bf16,
            ggml::Q8_0 => DType::Q8_0,
            ggml::Q4_0 => DType::Q4_0,
            other => {
                return Err(GgufError::Unsupported {
                    tensor: name,
                    ggml_type: other,
                })
            }
        };
        // GGUF stores dims innermost-first; row-major shape is the reverse.
        let shape_u64: Vec<u64> = dims.iter().rev().copied().collect();
        let (_, nbytes) = checked_size(&name, dtype, &shape_u64)?;
        if offset % alignment != 0 {
            return Err(Malformed::Misaligned {
                tensor: name,
                offset,
                align: alignment,
            }
            .into());
        }
        let end = offset.checked_add(nbytes);
        match end {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(Malformed::OffsetOutOfRange {
                    tensor: name,
                    start: offset,
                    end: end.unwrap_or(u64::MAX),
                    len: data_len,
                }
                .into())
            }
        }
        tensors.push(RawTensor {
            name,
            dtype,
            shape: shape_u64.iter().map(|&d| d as usize).collect(),
            offset: (data_start + offset) as usize,
            len: nbytes as usize,
        });
    }
    check_overlaps(&tensors)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start: data_start as usize,
    })
}

/// A tensor to write with [`write()`]: name, GGML type, row-major shape, raw data bytes.
pub struct WriteTensor<'a> {
    /// Name.
    pub name: &'a str,
    /// GGML type id.
    pub ggml_type: u32,
    /// Row-major shape (written innermost-first).
    pub shape: &'a [usize],
    /// Data bytes (already in the GGML layout).
    pub data: &'a [u8],
}

/// Header bytes of a GGUF file of `version` (2 or 3; no metadata) for tensors of the given byte sizes; returns the
/// header (already padded to the alignment) and each tensor's offset relative to the data section.
pub fn header_bytes(tensors: &[(&str, u32, &[usize], usize)], version: u32) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    let mut offsets = Vec::new();
    let mut off = 0u64;
    for (name, ty, shape, len) in tensors {
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            out.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
        offsets.push(off);
        off = (off + *len as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
    }
    while !(out.len() as u64).is_multiple_of(DEFAULT_ALIGNMENT) {
        out.push(0);
    }
    (out, offsets)
}

/// Serialise a complete GGUF v3 file in memory (tests, small fixtures).
pub fn write(tensors: &[WriteTensor<'_>]) -> Vec<u8> {
    let infos: Vec<(&str, u32, &[usize], usize)> = tensors
        .iter()
        .map(|t| (t.name, t.ggml_type, t.shape, t.data.len()))
        .collect();
    let (mut out, offsets) = header_bytes(&infos, 3);
    let base = out.len();
    for (t, off) in tensors.iter().zip(offsets) {
        out.resize(base + off as usize, 0);
        out.extend_from_slice(t.data);
    }
    while !(out.len() as u64).is_multiple_of(DEFAULT_ALIGNMENT) {
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let q8 = vec![0u8; 2 * 34];
        let f = vec![0u8; 3 * 4];
        write(&[
            WriteTensor {
                name: "w",
                ggml_type: ggml::Q8_0,
                shape: &[2, 32],
                data: &q8,
            },
            WriteTensor {
                name: "n",
                ggml_type: ggml::F32,
                shape: &[1, 1, 3],
                data: &f,
            },
        ])
    }

    #[test]
    fn roundtrip() {
        let h = parse(&sample()).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.tensors[0].shape, vec![2, 32]);
        assert_eq!(h.tensors[0].dtype, DType::Q8_0);
        assert_eq!(h.tensors[0].len, 68);
        assert_eq!(h.tensors[1].shape, vec![1, 1, 3]);
        assert_eq!(h.tensors[1].offset % 32, 0);
    }

    #[test]
    fn v2_and_metadata() {
        let mut b = sample();
        b[4] = 2;
        assert_eq!(parse(&b).unwrap().version, 2);
        b[4] = 1;
        assert!(matches!(
            parse(&b),
            Err(GgufError::Malformed(Malformed::UnsupportedVersion(1)))
        ));
        // One metadata string KV + general.alignment = 64.
        let mut m = Vec::new();
        m.extend_from_slice(&MAGIC.to_le_bytes());
        m.extend_from_slice(&3u32.to_le_bytes());
        m.extend_from_slice(&1u64.to_le_bytes());
        m.extend_from_slice(&2u64.to_le_bytes());
        for (k, t, v) in [
            ("general.name", 8u32, b"tiny".to_vec()),
            ("general.alignment", 4u32, 64u32.to_le_bytes().to_vec()),
        ] {
            m.extend_from_slice(&(k.len() as u64).to_le_bytes());
            m.extend_from_slice(k.as_bytes());
            m.extend_from_slice(&t.to_le_bytes());
            if t == 8 {
                m.extend_from_slice(&(v.len() as u64).to_le_bytes());
            }
            m.extend_from_slice(&v);
        }
        m.extend_from_slice(&1u64.to_le_bytes());
        m.push(b'x');
        m.extend_from_slice(&1u32.to_le_bytes());
        m.extend_from_slice(&4u64.to_le_bytes());
        m.extend_from_slice(&ggml::F32.to_le_bytes());
        m.extend_from_slice(&0u64.to_le_bytes());
        while m.len() % 64 != 0 {
            m.push(0);
        }
        m.extend_from_slice(&[0u8; 16]);
        let h = parse(&m).unwrap();
        assert_eq!(h.alignment, 64);
        assert_eq!(h.data_start % 64, 0);
        assert_eq!(h.metadata["general.name"], MetaValue::Str("tiny".into()));
    }

    #[test]
    fn unsupported_type_names_tensor() {
        let d = vec![0u8; 64];
        let b = write(&[WriteTensor {
            name: "blk.q4k",
            ggml_type: 12,
            shape: &[256],
            data: &d,
        }]);
        match parse(&b) {
            Err(GgufError::Unsupported { tensor, ggml_type }) => {
                assert_eq!(tensor, "blk.q4k");
                assert_eq!(ggml_type, 12);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed() {
        let b = sample();
        for cut in [0, 3, 7, 20, 30, 60] {
            assert!(
                matches!(
                    parse(&b[..cut]),
                    Err(GgufError::Malformed(
                        Malformed::Truncated { .. } | Malformed::BadMagic { .. }
                    ))
                ),
                "cut {cut}"
            );
        }
        // Huge tensor count: ends with Truncated without allocating.
        let mut h = b.clone();
        h[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(parse(&h), Err(GgufError::Malformed(_))));
        // Huge name length.
        let mut h = b.clone();
        h[24..32].copy_from_slice(&(10_000_000_000u64).to_le_bytes());
        assert!(matches!(
            parse(&h),
            Err(GgufError::Malformed(Malformed::Truncated { .. }))
        ));
        // Dims overflow: first tensor dim set to 2^60.
        let mut h = b.clone();
        let dim_pos = 24 + 8 + 1 + 4;
        h[dim_pos..dim_pos + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(
            parse(&h),
            Err(GgufError::Malformed(Malformed::DimsOverflow { .. }))
        ));
        // Non-UTF-8 name.
        let mut h = b.clone();
        h[32] = 0xff;
        assert!(matches!(
            parse(&h),
            Err(GgufError::Malformed(Malformed::NonUtf8Name { .. }))
        ));
        // Offset of the second tensor pointing at the first (overlap) and beyond the end.
        let hd = parse(&b).unwrap();
        let second_off_pos = {
            // name(8+1) + nd(4) + dims(3*8) + type(4) -> offset
            let first = 24 + 8 + 1 + 4 + 16 + 4 + 8;
            first + 8 + 1 + 4 + 24 + 4
        };
        let mut h = b.clone();
        h[second_off_pos..second_off_pos + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            parse(&h),
            Err(GgufError::Malformed(Malformed::Overlapping { .. }))
        ));
        let mut h = b.clone();
        h[second_off_pos..second_off_pos + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(
            parse(&h),
            Err(GgufError::Malformed(Malformed::OffsetOutOfRange { .. }))
        ));
        let mut h = b.clone();
        h[second_off_pos..second_off_pos + 8].copy_from_slice(&4u64.to_le_bytes());
        assert!(matches!(
            parse(&h),
            Err(GgufError::Malformed(Malformed::Misaligned { .. }))
        ));
        // Duplicate names.
        let d = vec![0u8; 4];
        let dup = write(&[
            WriteTensor {
                name: "a",
                ggml_type: ggml::F32,
                shape: &[1],
                data: &d,
            },
            WriteTensor {
                name: "a",
                ggml_type: ggml::F32,
                shape: &[1],
                data: &d,
            },
        ]);
        assert!(matches!(
            parse(&dup),
            Err(GgufError::Malformed(Malformed::DuplicateName(_)))
        ));
        // Q8_0 row not a multiple of 32.
        let d = vec![0u8; 34];
        let misfit = write(&[WriteTensor {
            name: "q",
            ggml_type: ggml::Q8_0,
            shape: &[1, 16],
            data: &d,
        }]);
        assert!(matches!(
            parse(&misfit),
            Err(GgufError::Malformed(Malformed::BlockMisfit { .. }))
        ));
        assert!(hd.tensors.len() == 2);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_mutations(pos in 0usize..200, val in proptest::num::u8::ANY) {
            let mut b = sample();
            let p = pos % b.len();
            b[p] = val;
            let _ = parse(&b);
        }
    }
}
