//! The Vulkan loader and the drivers it loads write to the process's stderr on their own (on a
//! headless Linux machine, `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` once
//! per probe, from the Wayland client library a driver links). That text is not ours to print:
//! [`quiet`] runs the GPU calls with stderr (file descriptor 2) pointed at a scratch file, then
//! prints back every line of it except the loader's known noise, so nothing else is lost.

/// Lines the loader or a driver prints on machines without a display, which say nothing about
/// moshi-native's work.
const NOISE: &[&str] = &["XDG_RUNTIME_DIR is invalid or not set"];

/// Whether `line` is loader noise.
pub fn is_noise(line: &str) -> bool {
    NOISE.iter().any(|n| line.contains(n))
}

/// Runs `f` (calls that reach the GPU loader) with the loader's noise on stderr filtered out.
pub fn quiet<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(unix)]
    {
        unix::quiet(f)
    }
    #[cfg(not(unix))]
    {
        f()
    }
}

#[cfg(unix)]
mod unix {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;

    extern "C" {
        fn dup(fd: i32) -> i32;
        fn dup2(from: i32, to: i32) -> i32;
        fn close(fd: i32) -> i32;
    }

    const STDERR: i32 = 2;

    pub fn quiet<T>(f: impl FnOnce() -> T) -> T {
        let path = std::env::temp_dir().join(format!(
            "moshi-native-stderr-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let Ok(mut scratch) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
        else {
            return f();
        };
        let _ = std::fs::remove_file(&path);
        let _ = std::io::stderr().flush();
        // SAFETY: dup/dup2/close on file descriptors this function owns (the duplicate of 2) or that
        // outlive the calls (2 and the scratch file); 2 is restored before returning.
        let saved = unsafe { dup(STDERR) };
        if saved < 0 || unsafe { dup2(scratch.as_raw_fd(), STDERR) } < 0 {
            if saved >= 0 {
                unsafe { close(saved) };
            }
            return f();
        }
        let out = f();
        let _ = std::io::stderr().flush();
        unsafe {
            dup2(saved, STDERR);
            close(saved);
        }
        let mut text = String::new();
        if scratch.rewind().is_ok() && scratch.read_to_string(&mut text).is_ok() {
            let mut err = std::io::stderr().lock();
            for line in text.lines().filter(|l| !super::is_noise(l)) {
                let _ = writeln!(err, "{line}");
            }
        }
        out
    }
}
