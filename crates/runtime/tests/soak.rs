//! Soak: a long conversation on the tiny bundle (its LM context is 10 steps and Mimi's 8, so the KV rings
//! wrap thousands of times). CI runs 2,000 frames; the full hour (45,000 frames, 12.5 Hz) is
//! `cargo test --release -p moshi-runtime --test soak -- --ignored` (see crates/runtime/RELIABILITY.md).

mod common;

use common::*;
use runtime::{Session, SessionOptions, Step, FRAME_SIZE};

/// Resident set size in bytes (Linux), if available.
fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn soak(frames: u64) {
    let mut s = Session::new(
        engine(),
        SessionOptions {
            max_queued_frames: 4,
            ..sampled(99)
        },
    )
    .unwrap();
    // One minute of varied input, looped; pushed in chunk sizes that drift across frame boundaries.
    let pcm = signal(750, 41);
    let chunks = [960usize, 1920, 480, 2400, 1000, 2880];
    let (mut pos, mut ci) = (0usize, 0usize);
    let (mut done, mut max_queued, mut pcm_out, mut text_frames) = (0u64, 0usize, 0usize, 0u64);
    let mut rss_after_warmup = None;
    let mut rss_max = 0u64;
    while done < frames {
        let n = chunks[ci % chunks.len()];
        ci += 1;
        let end = pos + n;
        if end <= pcm.len() {
            s.push_pcm(&pcm[pos..end]).unwrap();
            pos = end % pcm.len();
        } else {
            s.push_pcm(&pcm[pos..]).unwrap();
            s.push_pcm(&pcm[..end - pcm.len()]).unwrap();
            pos = end - pcm.len();
        }
        loop {
            match s.step().unwrap() {
                Step::Frame(f) => {
                    assert_eq!(f.frame_index, done, "the stream never restarts");
                    max_queued = max_queued.max(f.counters.queued);
                    pcm_out += f.pcm.len();
                    text_frames += u64::from(f.text_token.is_some());
                    assert!(
                        f.pcm.iter().all(|x| x.is_finite()),
                        "non-finite output at frame {done}"
                    );
                    done += 1;
                    if done % 1000 == 0 {
                        s.interrupt(); // output-side only; the model keeps going
                    }
                    if done == 500 {
                        rss_after_warmup = rss_bytes();
                    }
                    if done > 500 {
                        rss_max = rss_max.max(rss_bytes().unwrap_or(0));
                    }
                    if done == frames {
                        break;
                    }
                }
                Step::Idle => break,
                other => panic!("unexpected {other:?} at frame {done}"),
            }
        }
    }
    let c = s.counters();
    assert_eq!(c.frames_processed, frames);
    assert_eq!(
        c.frames_dropped, 0,
        "stepping after every push never lets the queue overflow"
    );
    assert!(max_queued <= 2, "queue depth stays flat (max {max_queued})");
    assert_eq!(text_frames, frames - 1);
    assert_eq!(pcm_out, (frames as usize - 1) * FRAME_SIZE);
    if let Some(base) = rss_after_warmup {
        let growth = rss_max.saturating_sub(base);
        assert!(
            growth < 4 << 20,
            "resident memory grew by {growth} bytes after warm-up"
        );
        eprintln!("soak {frames} frames: rss after warm-up {base} B, max growth {growth} B, max queue {max_queued}");
    }
}

#[test]
fn soak_2000_frames() {
    soak(2_000);
}

#[test]
#[ignore = "one hour of audio (45,000 frames); run with --release --ignored"]
fn soak_one_hour() {
    soak(45_000);
}
