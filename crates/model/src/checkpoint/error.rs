//! Typed errors of checkpoint loading: one variant per cause, each naming the offending keys or tensors.

use std::path::PathBuf;

/// Why a file is structurally invalid (truncated, inconsistent header, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// The file ends before a structure that must be there.
    #[error("truncated: needs {needed} bytes at offset {at}, file has {len}")]
    Truncated {
        /// Offset where the read started.
        at: u64,
        /// Bytes the read needed.
        needed: u64,
        /// Length of the file.
        len: u64,
    },
    /// A header length field claims more bytes than the file (or a sane limit) holds.
    #[error("header length {claimed} exceeds what the file allows ({limit} bytes)")]
    HeaderTooLarge {
        /// Claimed header length.
        claimed: u64,
        /// Largest acceptable value.
        limit: u64,
    },
    /// The header is not valid JSON / not the expected structure.
    #[error("invalid header: {0}")]
    InvalidHeader(String),
    /// Wrong magic number.
    #[error("bad magic {found:#010x}")]
    BadMagic {
        /// The magic read.
        found: u32,
    },
    /// Unsupported container version.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u32),
    /// A tensor or key name is not UTF-8.
    #[error("name at offset {at} is not UTF-8")]
    NonUtf8Name {
        /// Offset of the name bytes.
        at: u64,
    },
    /// The same tensor name appears twice.
    #[error("duplicate tensor name `{0}`")]
    DuplicateName(String),
    /// The element count of a tensor overflows (or is absurdly large).
    #[error("tensor `{tensor}`: dims {dims:?} overflow")]
    DimsOverflow {
        /// Tensor name.
        tensor: String,
        /// Declared dims.
        dims: Vec<u64>,
    },
    /// A tensor's byte range is outside the data section.
    #[error("tensor `{tensor}`: bytes {start}..{end} outside data section of {len} bytes")]
    OffsetOutOfRange {
        /// Tensor name.
        tensor: String,
        /// Start offset (relative to the data section).
        start: u64,
        /// End offset.
        end: u64,
        /// Length of the data section.
        len: u64,
    },
    /// A tensor's byte length does not match its dtype and shape.
    #[error("tensor `{tensor}`: {found} bytes, dtype and shape need {expected}")]
    ByteSizeMismatch {
        /// Tensor name.
        tensor: String,
        /// Bytes the dtype/shape need.
        expected: u64,
        /// Bytes declared.
        found: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors `{a}` and `{b}` overlap")]
    Overlapping {
        /// First tensor.
        a: String,
        /// Second tensor.
        b: String,
    },
    /// Tensor data is not aligned as the format requires.
    #[error("tensor `{tensor}`: offset {offset} not aligned to {align}")]
    Misaligned {
        /// Tensor name.
        tensor: String,
        /// Offset.
        offset: u64,
        /// Required alignment.
        align: u64,
    },
    /// A dtype string / type id that the container format does not define.
    #[error("tensor `{tensor}`: unknown dtype `{dtype}`")]
    UnknownDtype {
        /// Tensor name.
        tensor: String,
        /// The dtype as written.
        dtype: String,
    },
    /// A block-quantized tensor whose row length is not a multiple of the block size.
    #[error("tensor `{tensor}`: innermost dim {inner} not a multiple of block {block}")]
    BlockMisfit {
        /// Tensor name.
        tensor: String,
        /// Innermost dimension.
        inner: u64,
        /// Block size.
        block: u64,
    },
    /// Two source tensors map onto the same canonical tensor (e.g. both `in_proj_weight` and `in_projs.0`).
    #[error("`{a}` and `{b}` both map to `{canonical}`")]
    MappingConflict {
        /// First source name.
        a: String,
        /// Second source name.
        b: String,
        /// Canonical name.
        canonical: String,
    },
    /// Something else inconsistent.
    #[error("{0}")]
    Other(String),
}

/// Errors of `model::checkpoint` (configs, bundles, weight files).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// I/O failure on a file.
    #[error("{path}: {source}")]
    Io {
        /// File concerned.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A structurally invalid file.
    #[error("{path}: malformed file: {kind}")]
    Malformed {
        /// File concerned.
        path: PathBuf,
        /// What is wrong.
        kind: Malformed,
    },
    /// A file whose format could not be recognised.
    #[error("{path}: unrecognised checkpoint format ({reason})")]
    UnknownFormat {
        /// File concerned.
        path: PathBuf,
        /// Why detection failed.
        reason: String,
    },
    /// A config JSON that does not parse.
    #[error("config {source_name}: invalid JSON: {message}")]
    ConfigJson {
        /// Which config (file name or "config.json").
        source_name: String,
        /// Parser message.
        message: String,
    },
    /// A config key with a value of the wrong type or out of range.
    #[error("config key `{key}`: {reason}")]
    ConfigValue {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// Config keys that this engine does not know.
    #[error("unknown config keys: {}", list(keys))]
    UnknownConfigKeys {
        /// The keys.
        keys: Vec<String>,
    },
    /// `model_type` other than "moshi".
    #[error("unsupported model_type `{model_type}` (only \"moshi\" is supported)")]
    UnsupportedModelType {
        /// The value found.
        model_type: String,
    },
    /// An architecture option this engine does not implement (norm, gating, positional embedding, ...).
    #[error("unsupported architecture option `{key}` = {value}: {reason}")]
    UnsupportedArchitecture {
        /// The config key.
        key: String,
        /// Its value.
        value: String,
        /// What is supported instead.
        reason: String,
    },
    /// LoRA adapters (config `lora`/`lora_name`, tensors `*.lora_A/B`).
    #[error("LoRA is not supported (found: {})", list(keys))]
    Lora {
        /// Offending keys or tensor names.
        keys: Vec<String>,
    },
    /// Conditioners / condition fuser / classifier-free guidance.
    #[error("conditioning / fuser / CFG is not supported (found: {})", list(keys))]
    Conditioning {
        /// Offending keys or tensor names.
        keys: Vec<String>,
    },
    /// Cross-attention layers.
    #[error("cross-attention is not supported (found: {})", list(keys))]
    CrossAttention {
        /// Offending keys or tensor names.
        keys: Vec<String>,
    },
    /// bitsandbytes int8 checkpoints (`*.weight_scb`, int8 weights, `quantize: true`).
    #[error(
        "bitsandbytes int8 checkpoints are not supported (found: {})",
        list(keys)
    )]
    BitsAndBytes {
        /// Offending keys or tensor names.
        keys: Vec<String>,
    },
    /// Demultiplexed second text stream.
    #[error("demux second text stream is not supported (found: {})", list(keys))]
    Demux {
        /// Offending keys or tensor names.
        keys: Vec<String>,
    },
    /// Extra output heads.
    #[error("extra heads are not supported (found: {})", list(keys))]
    ExtraHeads {
        /// Offending keys or tensor names.
        keys: Vec<String>,
    },
    /// Low-rank depformer embeddings.
    #[error("low-rank embeddings are not supported (found: {})", list(keys))]
    LowRankEmbeddings {
        /// Offending keys or tensor names.
        keys: Vec<String>,
    },
    /// TTS / STT / other task configs.
    #[error("task-specific configs are not supported (found: {})", list(keys))]
    TaskConfig {
        /// Offending keys.
        keys: Vec<String>,
    },
    /// A known layout this engine does not read (Hugging Face `transformers` Moshi LM weights or config).
    #[error("unsupported layout: {what} (found: {})", list(keys))]
    UnsupportedLayout {
        /// Which layout.
        what: String,
        /// Keys or tensor names that identify it.
        keys: Vec<String>,
    },
    /// Tensors the architecture needs but the file lacks.
    #[error("missing tensors: {}", list(names))]
    MissingTensor {
        /// Canonical names.
        names: Vec<String>,
    },
    /// Tensors the file holds but the architecture does not use.
    #[error("unexpected tensors: {}", list(names))]
    UnexpectedTensor {
        /// Names as found in the file.
        names: Vec<String>,
    },
    /// A tensor whose shape is not what the architecture needs.
    #[error("tensor `{name}`: shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Canonical name.
        name: String,
        /// Shape the schema requires.
        expected: Vec<usize>,
        /// Shape found.
        found: Vec<usize>,
    },
    /// A tensor stored in a dtype not allowed for its role.
    #[error("tensor `{name}`: dtype {dtype} not allowed (allowed: {allowed})")]
    DtypeNotAllowed {
        /// Canonical (or file) name.
        name: String,
        /// Dtype found.
        dtype: String,
        /// Allowed dtypes.
        allowed: String,
    },
    /// A GGUF tensor of a GGML type this engine does not read.
    #[error("tensor `{tensor}`: unsupported GGML type {ggml_type} ({type_name})")]
    UnsupportedGgmlType {
        /// Tensor name.
        tensor: String,
        /// Type id.
        ggml_type: u32,
        /// Type name if known.
        type_name: &'static str,
    },
    /// An MLX quantized triplet that is incomplete or inconsistent.
    #[error("MLX quantized tensor `{name}`: {reason}")]
    BadQuantization {
        /// Base name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A name that is not in the weights (lookup by the model code).
    #[error("no tensor named `{0}`")]
    NoSuchTensor(String),
    /// A bundle directory lacks a required file.
    #[error("bundle {dir}: missing {what} ({file})")]
    MissingFile {
        /// Bundle directory.
        dir: PathBuf,
        /// Role of the file.
        what: &'static str,
        /// File name looked for.
        file: String,
    },
    /// Error from the kernels crate while building a matrix.
    #[error("tensor `{name}`: {message}")]
    Kernel {
        /// Canonical name.
        name: String,
        /// Kernel error text.
        message: String,
    },
}

/// Render a list of names, at most 8 of them, with the count of the others.
fn list(v: &[String]) -> String {
    const SHOW: usize = 8;
    let mut out = v
        .iter()
        .take(SHOW)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if v.len() > SHOW {
        out.push_str(&format!(
            ", ... ({} more, {} in total)",
            v.len() - SHOW,
            v.len()
        ));
    }
    out
}
