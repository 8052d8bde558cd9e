//! `moshi-native fetch`: download a released bundle into the Hugging Face hub cache.
//!
//! A small resolver of our own rather than the `hf-hub` crate: we need resumable downloads
//! (HTTP `Range` on a `.incomplete` file), a configurable endpoint (`HF_ENDPOINT`, as the
//! official client) for loopback tests, and an offline failure that names the files to place by
//! hand. The cache layout written here is the hub's own (`models--org--name/refs/main`,
//! `snapshots/<revision>/<file>`), so other tools find the files too.
//!
//! A rerun skips every file already complete in the snapshot that `refs/main` names: a file only
//! gets there by an atomic rename after its byte count matched the hub's `Content-Length`, so a
//! failure on the last file of a bundle does not download the others again.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::models::{hub_cache_dir, repo_cache_dir, repo_spec, Preset, RepoSpec, Variant};
use crate::models::{stt_repo_spec, SttRelease, STT_DEFAULT_PRESET};

/// The public hub, used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Flags of `moshi-native fetch`.
#[derive(Args, Debug, Clone)]
pub struct FetchArgs {
    /// Released Moshi voice (default moshiko).
    #[arg(long, value_enum, conflicts_with = "model")]
    pub variant: Option<Variant>,
    /// A speech-to-text model instead of Moshi: `stt-1b` (kyutai/stt-1b-en_fr) or `stt-2.6b`
    /// (kyutai/stt-2.6b-en); presets bf16 (PyTorch, the default), candle-bf16, mlx-bf16.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Released weight format (default: q8 for Moshi, bf16 for speech-to-text).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Hub cache root to download into (default: HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Runs `fetch`: downloads every file of the bundle and prints the snapshot directory.
pub fn run(args: &FetchArgs) -> Result<()> {
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string());
    let cache = args.dir.clone().unwrap_or_else(hub_cache_dir);
    let (what, spec) = plan(args)?;
    let snap = fetch_repo(&endpoint, &cache, &spec, true)?;
    println!("{what} ready in {}", snap.display());
    Ok(())
}

/// What `fetch` downloads for `args`: a name for the output line (`moshiko q8`, `stt-1b bf16`)
/// and the repository with its files. No network.
pub fn plan(args: &FetchArgs) -> Result<(String, RepoSpec)> {
    if let Some(name) = &args.model {
        let Some(v) = SttRelease::parse(name) else {
            bail!(
                "unknown --model `{name}`\nhint: fetch knows the speech-to-text models stt-1b and stt-2.6b; Moshi is chosen with --variant"
            );
        };
        let preset = args.preset.unwrap_or(STT_DEFAULT_PRESET);
        return Ok((format!("{v} {preset}"), stt_repo_spec(v, preset)?));
    }
    let variant = args.variant.unwrap_or(Variant::Moshiko);
    let preset = args.preset.unwrap_or(Preset::Q8);
    Ok((format!("{variant} {preset}"), repo_spec(variant, preset)))
}

/// Downloads (or resumes) every file of `spec` into the hub cache at `cache`; returns the snapshot dir.
pub fn fetch_repo(
    endpoint: &str,
    cache: &Path,
    spec: &RepoSpec,
    progress: bool,
) -> Result<PathBuf> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(Duration::from_secs(60))
        .build();
    let repo_dir = repo_cache_dir(cache, &spec.repo);
    let mut snap = None;
    for file in &spec.files {
        if let Some(rev) = complete_in_snapshot(&repo_dir, file) {
            if progress {
                eprintln!("{file}: already downloaded");
            }
            snap = Some(repo_dir.join("snapshots").join(rev));
            continue;
        }
        let rev = fetch_file(&agent, endpoint, &repo_dir, spec, file, progress)?;
        let dir = repo_dir.join("snapshots").join(&rev);
        fs::create_dir_all(repo_dir.join("refs"))?;
        fs::write(repo_dir.join("refs").join("main"), &rev)?;
        snap = Some(dir);
    }
    snap.context("a bundle has at least one file")
}

/// The revision whose snapshot already holds a complete `file` (the one `refs/main` names), if any.
fn complete_in_snapshot(repo_dir: &Path, file: &str) -> Option<String> {
    let rev = fs::read_to_string(repo_dir.join("refs").join("main")).ok()?;
    let rev = rev.trim();
    let path = repo_dir.join("snapshots").join(rev).join(file);
    let len = fs::metadata(&path).ok()?.len();
    (len > 0).then(|| rev.to_string())
}

fn offline_hint(endpoint: &str, cache: &Path, spec: &RepoSpec) -> String {
    let dir = repo_cache_dir(cache, &spec.repo);
    format!(
        "hint: without network, download {} from {endpoint}/{} by hand and put them in {}/snapshots/manual/ \
         with the word `manual` in {}/refs/main (or put them in any folder and pass --model-dir)",
        spec.files.join(", "),
        spec.repo,
        dir.display(),
        dir.display()
    )
}

/// Downloads one file, resuming a previous partial download; returns the repository revision.
fn fetch_file(
    agent: &ureq::Agent,
    endpoint: &str,
    repo_dir: &Path,
    spec: &RepoSpec,
    file: &str,
    progress: bool,
) -> Result<String> {
    let url = format!(
        "{}/{}/resolve/main/{}",
        endpoint.trim_end_matches('/'),
        spec.repo,
        file
    );
    let blobs = repo_dir.join("blobs");
    fs::create_dir_all(&blobs).with_context(|| format!("cannot create {}", blobs.display()))?;
    let partial = blobs.join(format!("{}.incomplete", file.replace('/', "_")));
    let have = fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);

    let mut req = agent.get(&url);
    if have > 0 {
        req = req.set("Range", &format!("bytes={have}-"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(404, _)) => bail!(
            "{file} was not found in {} (HTTP 404 from {url})\nhint: check --variant/--preset; the repository layout may have changed",
            spec.repo
        ),
        Err(ureq::Error::Status(416, _)) if have > 0 => {
            // Our partial file is not a prefix the server accepts: start over.
            fs::remove_file(&partial)?;
            return fetch_file(agent, endpoint, repo_dir, spec, file, progress);
        }
        Err(ureq::Error::Status(code, _)) => {
            bail!("download of {file} from {} failed: HTTP {code} ({url})", spec.repo)
        }
        Err(e) => bail!(
            "cannot reach {endpoint} to download {} ({e})\n{}",
            spec.repo,
            offline_hint(endpoint, repo_dir.parent().unwrap_or(repo_dir), spec)
        ),
    };
    let rev = resp
        .header("x-repo-commit")
        .filter(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric()))
        .unwrap_or("main")
        .to_string();
    let resumed = resp.status() == 206;
    let start = if resumed { have } else { 0 };
    let total = resp
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok())
        .map(|n| n + start);
    let mut out = if resumed {
        OpenOptions::new().append(true).open(&partial)?
    } else {
        File::create(&partial)?
    };
    let bar = if progress {
        let b = ProgressBar::new(total.unwrap_or(0));
        b.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(file.to_string());
        b.set_position(start);
        b
    } else {
        ProgressBar::hidden()
    };
    let mut reader = resp.into_reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = start;
    loop {
        let n = reader.read(&mut buf).with_context(|| {
            format!("download of {file} interrupted at {got} bytes; run the same command again to resume")
        })?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        got += n as u64;
        bar.set_position(got);
    }
    out.sync_all()?;
    bar.finish_and_clear();
    if let Some(t) = total {
        if got != t {
            bail!("download of {file} stopped at {got} of {t} bytes; run the same command again to resume");
        }
    }
    let dir = repo_dir.join("snapshots").join(&rev);
    fs::create_dir_all(&dir)?;
    fs::rename(&partial, dir.join(file))?;
    Ok(rev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};
    use testkit::ScratchDir;

    /// A loopback server mimicking the hub's `resolve` URLs. `cut` truncates the first response
    /// of each file after that many body bytes (an interrupted download).
    fn serve(
        files: Vec<(String, Vec<u8>)>,
        cut: Option<usize>,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        serve_cutting(files, cut, None)
    }

    /// [`serve`], cutting only the file whose path ends with `only` (every file when `None`).
    fn serve_cutting(
        files: Vec<(String, Vec<u8>)>,
        cut: Option<usize>,
        only: Option<String>,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut cut_done = std::collections::HashSet::new();
            for stream in l.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut range = None;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        range = v.trim().trim_end_matches('-').parse::<usize>().ok();
                    }
                }
                log2.lock().unwrap().push(format!("{path} {range:?}"));
                let Some((_, body)) = files.iter().find(|(p, _)| path.ends_with(p.as_str())) else {
                    let _ = s.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                };
                let start = range.unwrap_or(0);
                let part = &body[start..];
                let status = if range.is_some() {
                    "206 Partial Content"
                } else {
                    "200 OK"
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nX-Repo-Commit: deadbeef\r\nConnection: close\r\n\r\n",
                    part.len()
                );
                let _ = s.write_all(head.as_bytes());
                let cut_this = only.as_ref().is_none_or(|o| path.ends_with(o.as_str()));
                match cut {
                    Some(n) if cut_this && cut_done.insert(path.clone()) => {
                        let _ = s.write_all(&part[..n.min(part.len())]);
                    }
                    _ => {
                        let _ = s.write_all(part);
                    }
                }
            }
        });
        (format!("http://{addr}"), log)
    }

    fn spec_files(spec: &RepoSpec) -> Vec<(String, Vec<u8>)> {
        spec.files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let body: Vec<u8> = (0..5000 + i * 777).map(|j| (j * 31 + i) as u8).collect();
                (format!("{}/resolve/main/{f}", spec.repo), body)
            })
            .collect()
    }

    #[test]
    fn downloads_into_hub_layout() {
        let spec = repo_spec(Variant::Moshika, Preset::Q4);
        let files = spec_files(&spec);
        let (ep, _) = serve(files.clone(), None);
        let cache = ScratchDir::new("fetch-ok");
        let snap = fetch_repo(&ep, &cache, &spec, false).unwrap();
        assert_eq!(
            snap,
            repo_cache_dir(&cache, &spec.repo).join("snapshots/deadbeef")
        );
        for (f, (_, body)) in spec.files.iter().zip(&files) {
            assert_eq!(&fs::read(snap.join(f)).unwrap(), body);
        }
        assert_eq!(crate::models::find_in_cache(&cache, &spec), Some(snap));
    }

    #[test]
    fn missing_file_is_a_404_error() {
        let spec = repo_spec(Variant::Moshiko, Preset::Bf16);
        let (ep, _) = serve(vec![], None);
        let cache = ScratchDir::new("fetch-404");
        let err = fetch_repo(&ep, &cache, &spec, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("HTTP 404") && err.contains("model.safetensors"),
            "{err}"
        );
    }

    #[test]
    fn interrupted_download_resumes_with_range() {
        let spec = repo_spec(Variant::Moshiko, Preset::Q8);
        let files = spec_files(&spec);
        let (ep, log) = serve(files.clone(), Some(1234));
        let cache = ScratchDir::new("fetch-resume");
        let err = fetch_repo(&ep, &cache, &spec, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("resume"), "{err}");
        let partial = repo_cache_dir(&cache, &spec.repo).join("blobs/model.q8.gguf.incomplete");
        assert_eq!(fs::metadata(&partial).unwrap().len(), 1234);
        // Each file is cut once; keep running until everything is there, as a user would.
        let mut snap = None;
        for _ in 0..spec.files.len() + 1 {
            if let Ok(s) = fetch_repo(&ep, &cache, &spec, false) {
                snap = Some(s);
                break;
            }
        }
        let snap = snap.expect("resumed download completes");
        for (f, (_, body)) in spec.files.iter().zip(&files) {
            assert_eq!(&fs::read(snap.join(f)).unwrap(), body, "{f}");
        }
        let log = log.lock().unwrap();
        assert!(
            log.iter().any(|l| l.contains("model.q8.gguf Some(1234)")),
            "{log:?}"
        );
    }

    #[test]
    fn rerun_after_failure_on_last_file_fetches_only_that_file() {
        let spec = repo_spec(Variant::Moshiko, Preset::Q8);
        assert!(spec.files.len() >= 2);
        let last = spec.files.last().unwrap().to_string();
        let files = spec_files(&spec);
        let (ep, log) = serve_cutting(files.clone(), Some(777), Some(last.clone()));
        let cache = ScratchDir::new("fetch-last");
        let err = fetch_repo(&ep, &cache, &spec, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&last) && err.contains("resume"), "{err}");
        let first_run: Vec<String> = std::mem::take(&mut *log.lock().unwrap());
        assert_eq!(first_run.len(), spec.files.len(), "{first_run:?}");

        let snap = fetch_repo(&ep, &cache, &spec, false).unwrap();
        for (f, (_, body)) in spec.files.iter().zip(&files) {
            assert_eq!(&fs::read(snap.join(f)).unwrap(), body, "{f}");
        }
        // The rerun asked for the last file only, from where it stopped.
        let rerun: Vec<String> = std::mem::take(&mut *log.lock().unwrap());
        assert_eq!(
            rerun,
            vec![format!("/{}/resolve/main/{last} Some(777)", spec.repo)]
        );
        // A third run finds everything in place and asks for nothing.
        assert_eq!(fetch_repo(&ep, &cache, &spec, false).unwrap(), snap);
        assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
    }

    fn fetch_args(flags: &[&str]) -> FetchArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: FetchArgs,
        }
        let mut v = vec!["fetch"];
        v.extend_from_slice(flags);
        Cli::try_parse_from(v).map(|c| c.args).unwrap()
    }

    #[test]
    fn plans_name_moshi_and_stt_repositories() {
        let (what, spec) = plan(&fetch_args(&[])).unwrap();
        assert_eq!(
            (what.as_str(), spec.repo.as_str()),
            ("moshiko q8", "kyutai/moshiko-candle-q8")
        );
        let (what, spec) = plan(&fetch_args(&["--model", "stt-1b"])).unwrap();
        assert_eq!(
            (what.as_str(), spec.repo.as_str()),
            ("stt-1b bf16", "kyutai/stt-1b-en_fr")
        );
        let (_, spec) = plan(&fetch_args(&[
            "--model",
            "stt-2.6b",
            "--preset",
            "candle-bf16",
        ]))
        .unwrap();
        assert_eq!(spec.repo, "kyutai/stt-2.6b-en-candle");
        assert!(spec.files.contains(&"tokenizer_en_audio_4000.model"));
        let (_, spec) = plan(&fetch_args(&["--model", "stt-1b", "--preset", "mlx-bf16"])).unwrap();
        assert_eq!(spec.repo, "kyutai/stt-1b-en_fr-mlx");
        let e = plan(&fetch_args(&["--model", "stt-1b", "--preset", "q4"])).unwrap_err();
        assert!(e.to_string().contains("no `q4` release"), "{e}");
        assert!(plan(&fetch_args(&["--model", "moshiko"])).is_err());
    }

    #[test]
    fn stt_bundle_downloads_and_resolves_for_stt() {
        // The whole STT plan through the loopback hub, then `stt --model stt-1b --preset candle-bf16`'s
        // resolution finds the snapshot.
        let (_, spec) = plan(&fetch_args(&[
            "--model",
            "stt-1b",
            "--preset",
            "candle-bf16",
        ]))
        .unwrap();
        let files = spec_files(&spec);
        let (ep, log) = serve(files.clone(), None);
        let cache = ScratchDir::new("fetch-stt");
        let snap = fetch_repo(&ep, &cache, &spec, false).unwrap();
        for (f, (_, body)) in spec.files.iter().zip(&files) {
            assert_eq!(&fs::read(snap.join(f)).unwrap(), body, "{f}");
        }
        let log = log.lock().unwrap();
        assert!(
            log.iter().any(|l| l.starts_with(
                "/kyutai/stt-1b-en_fr-candle/resolve/main/mimi-pytorch-e351c8d8@125.safetensors"
            )),
            "{log:?}"
        );
        let found =
            crate::models::resolve_stt(Some("stt-1b"), None, Some(Preset::CandleBf16), &cache)
                .unwrap();
        assert_eq!(found, (snap, false));
    }

    #[test]
    fn offline_fails_fast_naming_repo_and_files() {
        // A closed port on loopback: connection refused, as with no network.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let spec = repo_spec(Variant::Moshiko, Preset::Q8);
        let cache = ScratchDir::new("fetch-offline");
        let t = std::time::Instant::now();
        let err = fetch_repo(&format!("http://127.0.0.1:{port}"), &cache, &spec, false)
            .unwrap_err()
            .to_string();
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(err.contains("kyutai/moshiko-candle-q8"), "{err}");
        for f in &spec.files {
            assert!(err.contains(f), "{err}");
        }
        assert!(err.contains("models--kyutai--moshiko-candle-q8"), "{err}");
    }
}
