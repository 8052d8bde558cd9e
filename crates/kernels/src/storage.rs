//! Byte storage that is owned or borrowed from a shared owner (e.g. an mmap).

use std::sync::Arc;

use crate::KernelError;

/// Bytes that may be owned or borrowed from a shared owner (e.g. an mmap), never
/// copied on clone (cloning bumps a reference count).
#[derive(Clone)]
pub struct Storage {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    offset: usize,
    len: usize,
}

impl Storage {
    /// Takes ownership of a byte vector.
    pub fn from_vec(bytes: Vec<u8>) -> Storage {
        let len = bytes.len();
        Storage {
            owner: Arc::new(bytes),
            offset: 0,
            len,
        }
    }

    /// Borrows `len` bytes at `offset` of a shared owner (for example an `Arc<memmap2::Mmap>`).
    /// Fails if the range does not lie inside the owner.
    pub fn from_shared(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        offset: usize,
        len: usize,
    ) -> Result<Storage, KernelError> {
        let total = (*owner).as_ref().len();
        match offset.checked_add(len) {
            Some(end) if end <= total => Ok(Storage { owner, offset, len }),
            _ => Err(KernelError::OutOfRange { offset, len, total }),
        }
    }

    /// Copies f32 values into a new owned storage (little-endian bytes).
    pub fn from_f32(values: &[f32]) -> Storage {
        let mut b = Vec::with_capacity(values.len() * 4);
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        Storage::from_vec(b)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.offset..self.offset + self.len]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the storage holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_range_is_checked() {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![1u8, 2, 3, 4]);
        let s = Storage::from_shared(owner.clone(), 1, 2).unwrap();
        assert_eq!(s.as_bytes(), &[2, 3]);
        assert!(Storage::from_shared(owner.clone(), 3, 2).is_err());
        assert!(Storage::from_shared(owner, usize::MAX, 2).is_err());
    }
}
