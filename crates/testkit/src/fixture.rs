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

    /// An f32 tensor: values and shape.
    pub fn f32(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let (d, shape) = self.raw(name, Dtype::F32);
        let v = d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (v, shape)
    }

    /// An i64 tensor: values and shape.
    pub fn i64(&self, name: &str) -> (Vec<i64>, Vec<usize>) {
        let (d, shape) = self.raw(name, Dtype::I64);
        let v = d
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (v, shape)
    }
}
