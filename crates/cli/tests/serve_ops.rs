//! `serve` as an operator meets it, on real child processes and the demo model: the thread policy's
//! start-up line and two conversations in the one batched worker, the per-session log lines (text and
//! JSON), the idle timeout, and the checks that fail before the model is loaded (port in use, TLS files,
//! GPU adapter; `duplex --out`). A minimal blocking WebSocket client keeps the test free of extra
//! dependencies; the audio is real Ogg/Opus.
#![cfg(unix)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::ScratchDir;

mod common;

use common::{free_port, metric, send_tone_frame, Ws};

/// A `serve --model demo` child with its own cache folder and stderr file.
struct Serve {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
    _dir: ScratchDir,
}

impl Serve {
    fn start(tag: &str, flags: &[&str]) -> Serve {
        let port = free_port();
        let dir = ScratchDir::new(tag);
        let log = dir.join("stderr.txt");
        let child = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
            .env("XDG_CACHE_HOME", dir.join("xdg"))
            .env_remove("RUST_LOG")
            .args(["serve", "--model", "demo", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut s = Serve {
            child,
            port,
            log,
            _dir: dir,
        };
        let up = Instant::now();
        while metric(port, "moshi_sessions_active").is_none() {
            assert!(
                s.child.try_wait().unwrap().is_none(),
                "server exited early: {}",
                s.stderr()
            );
            assert!(up.elapsed() < Duration::from_secs(120), "never came up");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until stderr has `n` lines containing `needle`; returns them.
    fn lines(&self, needle: &str, n: usize) -> Vec<String> {
        let t = Instant::now();
        loop {
            let found: Vec<String> = self
                .stderr()
                .lines()
                .filter(|l| l.contains(needle))
                .map(String::from)
                .collect();
            if found.len() >= n {
                return found;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "fewer than {n} lines with `{needle}`:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(mut self) -> String {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
                panic!("still running 20 s after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stderr()
    }
}

/// Sends `frames` 80 ms frames of a tone in real time and reads what comes back; returns the audio
/// messages received.
fn talk(ws: &mut Ws, frames: u64, hz: f32) -> usize {
    let mut rd = Ws {
        s: ws.s.try_clone().unwrap(),
    };
    let reader = std::thread::spawn(move || {
        let mut audio = 0;
        rd.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        while let Some((op, p)) = rd.read() {
            if op == 8 {
                break;
            }
            if op == 2 && p.first() == Some(&1) {
                audio += 1;
            }
        }
        audio
    });
    let mut enc = server::codec::OggOpusEncoder::new().unwrap();
    let start = Instant::now();
    for i in 0..frames {
        assert!(send_tone_frame(ws, &mut enc, i, hz, start));
    }
    // The reader stops once nothing came for 5 s after the last frame.
    reader.join().unwrap()
}

#[test]
fn with_no_flags_a_lone_conversation_gets_every_core_and_others_join_the_batch() {
    let cores = runtime::physical_cores();
    let srv = Serve::start("serve-policy", &[]);
    let line = srv.lines("1 conversation gets", 1).remove(0);
    let threads = format!("1 conversation gets {cores} thread");
    assert!(
        line.contains(&threads) && line.contains("up to 4 share the batched step (one worker"),
        "{line}"
    );
    let mut a = Ws::connect(srv.port);
    a.wait_handshake();
    let mut b = Ws::connect(srv.port);
    b.wait_handshake();
    let ta = std::thread::spawn(move || (talk(&mut a, 25, 220.0), a));
    let tb = std::thread::spawn(move || (talk(&mut b, 25, 330.0), b));
    let (na, a) = ta.join().unwrap();
    let (nb, b) = tb.join().unwrap();
    assert!(na > 0 && nb > 0, "audio back: {na} {nb}");
    assert_eq!(metric(srv.port, "moshi_sessions_active"), Some(2));
    a.close();
    b.close();
    // Per-session log lines at the default level: start and end, with peer, duration and counts.
    let started = srv.lines("session started: peer 127.0.0.1:", 2);
    assert!(started[0].contains("slots taken"), "{started:?}");
    let ended = srv.lines("session ended: peer 127.0.0.1:", 2);
    for l in &ended {
        let frames_in: u64 = l
            .split("frames in ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no frame count in {l}"));
        assert!(
            frames_in > 0 && l.contains(" / out ") && l.contains("client closed"),
            "{l}"
        );
    }
    let log = srv.stop();
    // Both conversations were served by the one worker started at start-up.
    assert!(!log.contains("batched runner 2"), "{log}");
}

#[test]
fn json_logs_and_the_idle_timeout() {
    let srv = Serve::start(
        "serve-idle",
        &[
            "--log-format",
            "json",
            "--idle-timeout",
            "1",
            "--max-sessions",
            "1",
        ],
    );
    let mut a = Ws::connect(srv.port);
    a.wait_handshake();
    // Silent: closed by the server with the reason.
    let mut reason = None;
    while let Some((op, p)) = a.read() {
        if op == 8 {
            reason = Some(String::from_utf8_lossy(&p[2..]).into_owned());
            break;
        }
    }
    assert_eq!(reason.as_deref(), Some("idle: no audio for 1 s"));
    assert_eq!(
        metric(srv.port, "moshi_sessions_idle_closed_total"),
        Some(1)
    );
    let ended = srv.lines("session ended", 1);
    let v: serde_json::Value = serde_json::from_str(&ended[0]).expect("a JSON line");
    assert_eq!(v["level"], "INFO");
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains("idle: no audio for 1 s"), "{msg}");
    // The slot is free again.
    let mut b = Ws::connect(srv.port);
    b.wait_handshake();
    drop(b);
    srv.stop();
}

/// Runs the binary with a fresh cache folder; returns (exit success, stderr, whether anything was
/// written into the cache: the demo bundle is written there when the model is first located).
fn early(args: &[&str]) -> (bool, String, bool) {
    let dir = ScratchDir::new("serve-early");
    let xdg = dir.join("xdg");
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", &xdg)
        .args(args)
        .output()
        .unwrap();
    let touched = xdg.join("moshi-native").exists();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        touched,
    )
}

fn assert_failed_before_load(r: &(bool, String, bool), cause: &str) {
    let (ok, err, touched) = r;
    assert!(!ok, "succeeded:\n{err}");
    assert!(err.contains(cause), "cause `{cause}` not named:\n{err}");
    assert!(
        !err.contains("model loaded") && !err.contains("cannot open the model bundle"),
        "{err}"
    );
    assert!(
        !touched,
        "the model was located (demo written) first:\n{err}"
    );
}

#[test]
fn serve_fails_before_loading_on_a_port_in_use_bad_tls_files_or_no_such_gpu() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let base = ["serve", "--model", "demo", "--host", "127.0.0.1", "--port"];
    let r = early(&[&base[..], &[&port]].concat());
    assert_failed_before_load(&r, &format!("binding 127.0.0.1:{port}"));
    assert!(r.1.to_lowercase().contains("in use"), "{}", r.1);

    let missing = Path::new("/nonexistent/cert.pem").display().to_string();
    let r = early(
        &[
            &base[..],
            &[
                "0",
                "--tls-cert",
                &missing,
                "--tls-key",
                "/nonexistent/key.pem",
            ],
        ]
        .concat(),
    );
    assert_failed_before_load(&r, "/nonexistent/cert.pem");

    let r = early(&[&base[..], &["0", "--device", "gpu", "--gpu", "99"]].concat());
    assert_failed_before_load(&r, "adapter 99 requested");
}

#[test]
fn duplex_checks_its_output_paths_and_sampling_flags_before_loading() {
    let wav = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/verify-speech.wav");
    let wav = wav.to_str().unwrap();
    let base = ["duplex", "--model", "demo", "--in", wav];
    let r = early(&[&base[..], &["--out", "/nonexistent/dir/out.wav"]].concat());
    assert_failed_before_load(&r, "--out /nonexistent/dir/out.wav: cannot write there");
    let dir = ScratchDir::new("serve-early-out");
    let out = dir.join("out.wav");
    let out = out.to_str().unwrap();
    let r = early(
        &[
            &base[..],
            &["--out", out, "--text-out", "/nonexistent/t.txt"],
        ]
        .concat(),
    );
    assert_failed_before_load(&r, "--text-out /nonexistent/t.txt");
    let r = early(&[&base[..], &["--out", out, "--text-temperature=-1"]].concat());
    assert_failed_before_load(&r, "--text-temperature must be");
    assert!(!Path::new(out).exists(), "the check left a file behind");
}
