//! A long `runtime::Transcriber` stream allocates nothing once warm, however much word text it pulls: its
//! text buffer (`TEXT_RESERVE` bytes, 1024) is emptied whenever no queued word borrows it, so text far
//! beyond the reserve goes through it without growing it (issue 32: the 18 words of the C ABI's allocation
//! test never fill 1024 bytes, so a buffer that is never emptied passed there).
//!
//! This binary holds a single test so that no other test thread allocates while counting.

use std::path::PathBuf;

use runtime::{EngineOptions, SttEngine, Transcriber, TranscriberOptions, TranscriptEvent};
use testkit::all_thread_allocations_during as allocations;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

/// Word text the counted part must pull: eight times the transcriber's reserve.
const TEXT_BYTES: usize = 8 * 1024;

#[test]
fn word_text_far_beyond_the_reserve_allocates_nothing() {
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/stt/1b");
    let pcm = runtime::audio::read_wav_strict(dir.join("input.wav")).unwrap();
    let engine = SttEngine::open(&dir, EngineOptions::cpu(1)).unwrap();
    let mut t = Transcriber::new(engine, TranscriberOptions::default()).unwrap();
    // One stream: the oracle's input again and again (the tiny LM's and Mimi's rings wrap during warm-up).
    let pass = |t: &mut Transcriber| -> (usize, usize) {
        let (mut words, mut bytes) = (0, 0);
        for chunk in pcm.chunks(960) {
            t.push(chunk).unwrap();
            while let Some(e) = t.pull().unwrap() {
                if let TranscriptEvent::Word { text, .. } = e {
                    words += 1;
                    bytes += text.len();
                }
            }
        }
        (words, bytes)
    };
    for _ in 0..4 {
        pass(&mut t);
    }
    let (mut words, mut bytes, mut passes) = (0, 0, 0);
    let allocs = allocations(|| {
        while bytes < TEXT_BYTES && passes < 400 {
            let (w, b) = pass(&mut t);
            words += w;
            bytes += b;
            passes += 1;
        }
    });
    eprintln!("{passes} passes: {words} words, {bytes} bytes of text, {allocs} allocations");
    assert!(
        bytes >= TEXT_BYTES,
        "only {bytes} bytes of word text in {passes} passes"
    );
    assert_eq!(
        allocs, 0,
        "{allocs} allocations while pulling {words} words ({bytes} bytes of text)"
    );
}
