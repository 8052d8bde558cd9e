//! `moshi-native inspect … | head`: a reader that closes the pipe early ends the command quietly
//! (exit 0, nothing on stderr) instead of a panic on the failed write.

use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn inspect_into_a_closed_pipe_exits_quietly() {
    let bundle = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    // The read end is closed before the child starts, so its first line already meets EPIPE
    // (Rust ignores SIGPIPE: the write returns the error).
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .args(["inspect", "--tensors"])
        .arg(&bundle)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("binary runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "status {:?}: {stderr}", o.status);
    assert!(stderr.is_empty(), "stderr: {stderr}");
}
