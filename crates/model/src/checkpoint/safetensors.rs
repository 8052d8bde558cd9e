//! safetensors reader: validates the header completely before anything is sized from it.
//!
//! Layout: `u64` little-endian header length `n`, `n` bytes of JSON (`{name: {dtype, shape,
//! data_offsets: [start, end]}, "__metadata__": {..}}`), then the data section. The header is parsed
//! with a streaming visitor so duplicate names are detected (a plain JSON map would keep the last one).

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;

use super::{check_overlaps, checked_size, DType, Malformed, RawTensor};

/// Largest header accepted (the 7B checkpoints have headers of a few tens of KiB).
pub const MAX_HEADER: u64 = 100 << 20;

/// A parsed, validated safetensors header.
#[derive(Debug, Clone)]
pub struct Header {
    /// Tensors in file order, offsets absolute in the file.
    pub tensors: Vec<RawTensor>,
    /// `__metadata__` string map.
    pub metadata: BTreeMap<String, String>,
    /// Absolute offset of the data section.
    pub data_start: usize,
}

/// Parse and validate the header of a safetensors file whose full contents are `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Header, Malformed> {
    let file_len = bytes.len() as u64;
    if bytes.len() < 8 {
        return Err(Malformed::Truncated {
            at: 0,
            needed: 8,
            len: file_len,
        });
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let limit = (file_len - 8).min(MAX_HEADER);
    if n > limit {
        return Err(Malformed::HeaderTooLarge { claimed: n, limit });
    }
    let data_start = 8 + n as usize;
    let header = &bytes[8..data_start];
    // JSON text must be UTF-8; an invalid byte is almost always inside a tensor name.
    let text = std::str::from_utf8(header).map_err(|e| Malformed::NonUtf8Name {
        at: 8 + e.valid_up_to() as u64,
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let entries = de
        .deserialize_map(EntriesVisitor)
        .map_err(|e| Malformed::InvalidHeader(e.to_string()))?;
    de.end()
        .map_err(|e| Malformed::InvalidHeader(e.to_string()))?;
    let data_len = file_len - data_start as u64;
    let mut seen = HashSet::new();
    let mut tensors = Vec::new();
    let mut metadata = BTreeMap::new();
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(Malformed::DuplicateName(name));
        }
        // MLX 0.32's `save_safetensors` writes `"__metadata__": null` when given no metadata.
        if name == "__metadata__" && value.is_null() {
            continue;
        }
        if name == "__metadata__" {
            let obj = value
                .as_object()
                .ok_or_else(|| Malformed::InvalidHeader("__metadata__ is not an object".into()))?;
            for (k, v) in obj {
                let s = v.as_str().ok_or_else(|| {
                    Malformed::InvalidHeader(format!("__metadata__.{k} is not a string"))
                })?;
                metadata.insert(k.clone(), s.to_string());
            }
            continue;
        }
        tensors.push(tensor_info(&name, &value, data_start as u64, data_len)?);
    }
    check_overlaps(&tensors)?;
    Ok(Header {
        tensors,
        metadata,
        data_start,
    })
}

fn tensor_info(
    name: &str,
    v: &Value,
    data_start: u64,
    data_len: u64,
) -> Result<RawTensor, Malformed> {
    let bad = |what: &str| Malformed::InvalidHeader(format!("tensor `{name}`: {what}"));
    let obj = v.as_object().ok_or_else(|| bad("entry is not an object"))?;
    for k in obj.keys() {
        if !matches!(k.as_str(), "dtype" | "shape" | "data_offsets") {
            return Err(bad(&format!("unknown field `{k}`")));
        }
    }
    let dtype_s = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing dtype"))?;
    let dtype = DType::from_safetensors(dtype_s).ok_or_else(|| Malformed::UnknownDtype {
        tensor: name.to_string(),
        dtype: dtype_s.to_string(),
    })?;
    let shape_v = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing shape"))?;
    if shape_v.len() > 8 {
        return Err(bad("more than 8 dims"));
    }
    let mut dims = Vec::with_capacity(shape_v.len());
    for d in shape_v {
        dims.push(
            d.as_u64()
                .ok_or_else(|| bad("shape entry is not a non-negative integer"))?,
        );
    }
    let offs = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .ok_or_else(|| bad("data_offsets must be [start, end]"))?;
    let start = offs[0].as_u64().ok_or_else(|| bad("bad data_offsets"))?;
    let end = offs[1].as_u64().ok_or_else(|| bad("bad data_offsets"))?;
    let (_, bytes) = checked_size(name, dtype, &dims)?;
    if start > end || end > data_len {
        return Err(Malformed::OffsetOutOfRange {
            tensor: name.to_string(),
            start,
            end,
            len: data_len,
        });
    }
    if end - start != bytes {
        return Err(Malformed::ByteSizeMismatch {
            tensor: name.to_string(),
            expected: bytes,
            found: end - start,
        });
    }
    Ok(RawTensor {
        name: name.to_string(),
        dtype,
        shape: dims.iter().map(|&d| d as usize).collect(),
        offset: (data_start + start) as usize,
        len: bytes as usize,
    })
}

/// Collects the top-level JSON object as an ordered list of entries, keeping duplicates.
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, Value)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            let v: Value = map.next_value()?;
            out.push((k, v));
        }
        Ok(out)
    }
}

/// Serialise tensors into safetensors bytes (used by tests and the synthetic bundle writer).
///
/// `tensors` = (name, dtype name as safetensors writes it, shape, data bytes).
pub fn header_bytes(
    tensors: &[(String, &str, Vec<usize>, usize)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Vec<u8> {
    header_bytes_with(tensors, metadata, true)
}

/// [`header_bytes`], with the JSON padded to a multiple of 8 bytes (as the `safetensors` library
/// writes) or not (as MLX's `save_safetensors` writes, leaving the data section unaligned).
pub fn header_bytes_with(
    tensors: &[(String, &str, Vec<usize>, usize)],
    metadata: Option<&BTreeMap<String, String>>,
    pad: bool,
) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if let Some(m) = metadata {
        let obj: serde_json::Map<String, Value> = m
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        map.insert("__metadata__".into(), Value::Object(obj));
    }
    let mut off = 0usize;
    for (name, dtype, shape, len) in tensors {
        let mut e = serde_json::Map::new();
        e.insert("dtype".into(), Value::String(dtype.to_string()));
        e.insert("shape".into(), Value::from(shape.clone()));
        e.insert("data_offsets".into(), Value::from(vec![off, off + len]));
        map.insert(name.clone(), Value::Object(e));
        off += len;
    }
    let mut json = serde_json::to_vec(&Value::Object(map)).expect("serialisable");
    // Pad with spaces to a multiple of 8 so the data section is aligned.
    while pad && !(json.len() + 8).is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out
}

/// Serialise a complete safetensors file in memory (tests).
pub fn to_bytes(tensors: &[(String, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let infos: Vec<(String, &str, Vec<usize>, usize)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), *d, s.clone(), b.len()))
        .collect();
    let mut out = header_bytes(&infos, None);
    for (_, _, _, b) in tensors {
        out.extend_from_slice(b);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::err_variant;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    }

    #[test]
    fn valid_file_parses() {
        let b = to_bytes(&[
            ("a".into(), "F32", vec![2, 3], vec![0; 24]),
            ("b".into(), "BF16", vec![4], vec![0; 8]),
        ]);
        let h = parse(&b).unwrap();
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[1].shape, vec![4]);
        assert_eq!(h.tensors[1].offset, h.data_start + 24);
    }

    #[test]
    fn malformed_files_are_typed_errors() {
        assert!(matches!(
            parse(&[1, 2, 3]),
            Err(Malformed::Truncated { .. })
        ));
        // Claims a 10 GB header.
        let mut b = (10_000_000_000u64).to_le_bytes().to_vec();
        b.extend_from_slice(b"{}");
        assert!(matches!(parse(&b), Err(Malformed::HeaderTooLarge { .. })));
        // Header length beyond the file by one byte.
        let mut b = file("{}", 0);
        b[0] = 3;
        assert!(matches!(parse(&b), Err(Malformed::HeaderTooLarge { .. })));
        let mut nonutf = file("{\"\u{e9}\":1}", 0);
        let pos = nonutf.iter().position(|&c| c == 0xc3).unwrap();
        nonutf[pos] = 0xff;
        assert!(matches!(parse(&nonutf), Err(Malformed::NonUtf8Name { at }) if at == pos as u64));
        let dup = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(matches!(parse(&file(dup, 8)), Err(Malformed::DuplicateName(n)) if n == "a"));
        // One header per row: (header, data bytes, expected refusal).
        for (header, data, want) in [
            (
                r#"{"a":{"dtype":"F32","shape":[1073741824,1073741824],"data_offsets":[0,4]}}"#,
                4,
                "DimsOverflow",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#,
                4,
                "DimsOverflow",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                8,
                "OffsetOutOfRange",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
                "ByteSizeMismatch",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                12,
                "Overlapping",
            ),
            (
                r#"{"a":{"dtype":"F8_E4M3X","shape":[2],"data_offsets":[0,2]}}"#,
                2,
                "UnknownDtype",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}"#,
                4,
                "OffsetOutOfRange",
            ),
            ("{", 0, "InvalidHeader"),
            ("[]", 0, "InvalidHeader"),
        ] {
            assert_eq!(err_variant(&parse(&file(header, data))), want, "{header}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn never_panics_on_mutated_file(pos in 0usize..200, val in proptest::num::u8::ANY) {
            let mut b = to_bytes(&[
                ("x".into(), "F32", vec![2, 3], vec![0; 24]),
                ("y".into(), "F16", vec![5], vec![0; 10]),
            ]);
            let p = pos % b.len();
            b[p] = val;
            let _ = parse(&b);
        }
    }
}
