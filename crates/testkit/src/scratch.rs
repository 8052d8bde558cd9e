//! Temporary directories for tests that write files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory under the system temp dir, removed with its contents when dropped,
/// so a test that fails (panics) leaves nothing behind either.
///
/// The name holds the tag, the process id and a per-process counter: tests of one binary run in
/// parallel and concurrent test binaries share the temp dir, so neither may collide. A directory
/// left by an earlier process with the same id is cleared first.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `<temp>/moshi-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> ScratchDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "moshi-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        ScratchDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A writable copy of the tiny LM bundle `fixtures/lm` (symlinks followed, the oracle's traces
/// left out) in a [`ScratchDir`], for tests that damage a bundle before opening it.
pub fn lm_bundle_copy(tag: &str) -> ScratchDir {
    let dir = ScratchDir::new(tag);
    let src = crate::fixtures_dir("lm");
    for e in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display())) {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.starts_with("trace") || name == "CODES.safetensors" {
            continue;
        }
        std::fs::copy(e.path(), dir.join(&name)).unwrap();
    }
    dir
}

/// The fixture codec (`fixtures/mimi`) as a bundle directory of its own: a [`ScratchDir`] whose
/// `config.json` names the fixture's weights and config in place (removed when dropped), and the
/// fixture directory (its `input.wav` and traces).
pub fn mimi_bundle(tag: &str) -> (ScratchDir, std::path::PathBuf) {
    let fx = crate::fixtures_dir("mimi");
    let dir = ScratchDir::new(&format!("mimi-trace-{tag}"));
    let cfg = format!(
        r#"{{"mimi_name": "{}", "mimi_config_name": "{}"}}"#,
        fx.join("mimi.safetensors").display(),
        fx.join("mimi_config.json").display()
    );
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    (dir, fx)
}
