//! The oracle's fixture files (safetensors written by `tools/oracle/`), read whole.

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

/// `fixtures/<sub>` of this repository.
pub fn fixtures_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(sub)
}

/// A safetensors file in memory. Every reader panics, naming the file or tensor, when the tensor
/// is missing or of another dtype (a broken fixture is a failed test).
pub struct TensorFile {
    bytes: Vec<u8>,
}

impl TensorFile {
    /// Reads `path`.
    pub fn open(path: impl AsRef<Path>) -> TensorFile {
        let path = path.as_ref();
        TensorFile {
            bytes: std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        }
    }

    /// The names of the file's tensors.
    pub fn names(&self) -> Vec<String> {
        let st = SafeTensors::deserialize(&self.bytes).expect("a safetensors file");
        st.names().into_iter().map(String::from).collect()
    }

    /// The raw little-endian values of `name` (which must be of dtype `want`) and its shape.
    fn raw(&self, name: &str, want: Dtype) -> (Vec<u8>, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.bytes).expect("a safetensors file");
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), want, "{name}");
        (t.data().to_vec(), t.shape().to_vec())
    }

    /// The values of `name` (which must be of dtype `want`), each decoded from its `N`
    /// little-endian bytes by `from_le`, and its shape.
    fn values<T, const N: usize>(
        &self,
        name: &str,
        want: Dtype,
        from_le: fn([u8; N]) -> T,
    ) -> (Vec<T>, Vec<usize>) {
        let (d, shape) = self.raw(name, want);
        let v = d
            .chunks_exact(N)
            .map(|c| from_le(c.try_into().unwrap()))
            .collect();
        (v, shape)
    }

    /// An f32 tensor: values and shape.
    pub fn f32(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        self.values(name, Dtype::F32, f32::from_le_bytes)
    }

    /// An i64 tensor: values and shape.
    pub fn i64(&self, name: &str) -> (Vec<i64>, Vec<usize>) {
        self.values(name, Dtype::I64, i64::from_le_bytes)
    }
}

/// The samples of an oracle WAV (`write_wav_f32` in `tools/oracle/`: RIFF, 24 kHz mono IEEE
/// float32, format tag 3 or extensible). Panics, naming the file, on any other format or a file
/// without a `data` chunk after its `fmt ` chunk (a broken fixture is a failed test).
pub fn read_wav_f32(path: impl AsRef<Path>) -> Vec<f32> {
    let path = path.as_ref();
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        b.len() >= 12 && &b[0..4] == b"RIFF" && &b[8..12] == b"WAVE",
        "{}: not a RIFF WAVE file",
        path.display()
    );
    let (mut i, mut fmt_ok) = (12, false);
    while i + 8 <= b.len() {
        let n = u32::from_le_bytes(b[i + 4..i + 8].try_into().unwrap()) as usize;
        let body = &b[i + 8..(i + 8 + n).min(b.len())];
        match &b[i..i + 4] {
            b"fmt " => {
                let u16_at = |o: usize| u16::from_le_bytes([body[o], body[o + 1]]);
                let rate = u32::from_le_bytes(body[4..8].try_into().unwrap());
                let tag = u16_at(0);
                fmt_ok = (tag == 3 || tag == 0xFFFE)
                    && u16_at(2) == 1
                    && rate == 24_000
                    && u16_at(14) == 32;
                assert!(fmt_ok, "{}: not 24 kHz mono float32", path.display());
            }
            b"data" => {
                assert!(fmt_ok, "{}: data before fmt", path.display());
                return body
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
            }
            _ => {}
        }
        i += 8 + n + (n & 1);
    }
    panic!("{}: no data chunk", path.display());
}

/// Overwrites element `index` of the F32 tensor `name` in the safetensors file `file` with
/// `value` (a damaged copy for the non-finite-weight tests).
pub fn poke_f32(file: &Path, name: &str, index: usize, value: f32) {
    let mut bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let (header, meta) = SafeTensors::read_metadata(&bytes).expect("a safetensors file");
    let t = meta
        .info(name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    assert_eq!(t.dtype, Dtype::F32, "{name} must be F32");
    let at = 8 + header + t.data_offsets.0 + 4 * index;
    assert!(
        at + 4 <= 8 + header + t.data_offsets.1,
        "{name}[{index}] out of range"
    );
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    std::fs::write(file, bytes).unwrap();
}
