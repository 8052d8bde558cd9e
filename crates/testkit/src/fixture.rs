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
