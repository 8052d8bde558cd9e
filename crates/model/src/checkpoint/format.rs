//! Container format detection from a file's first bytes.

use std::path::Path;

use super::{gguf, CheckpointError, FileFormat, Malformed};

/// Detect the container format from the first bytes.
pub(crate) fn detect_format(path: &Path, bytes: &[u8]) -> Result<FileFormat, CheckpointError> {
    if bytes.len() >= 4 && u32::from_le_bytes(bytes[..4].try_into().expect("4")) == gguf::MAGIC {
        return Ok(FileFormat::Gguf);
    }
    // safetensors: u64 header length, then a JSON object (possibly after whitespace).
    if bytes.len() >= 9
        && bytes[8..bytes.len().min(64)]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{')
    {
        return Ok(FileFormat::Safetensors);
    }
    if bytes.len() < 9 {
        return Err(CheckpointError::Malformed {
            path: path.to_path_buf(),
            kind: Malformed::Truncated {
                at: 0,
                needed: 9,
                len: bytes.len() as u64,
            },
        });
    }
    Err(CheckpointError::UnknownFormat {
        path: path.to_path_buf(),
        reason: "neither GGUF magic nor a safetensors JSON header".into(),
    })
}
