//! The runtime API end to end: open an engine, create a session, feed a WAV in chunks from a "microphone"
//! thread, send a soft interrupt half-way, collect Moshi's audio and text, write the audio to a WAV.
//!
//! ```text
//! cargo run -p moshi-runtime --example duplex -- [BUNDLE_DIR] [IN.wav] [OUT.wav]
//! ```
//! Defaults: the tiny random-weight bundle `fixtures/lm`, `fixtures/duplex/input.wav`, `target/duplex-example.wav`.

use std::path::PathBuf;
use std::time::Duration;

use runtime::audio::{read_wav, write_wav_mono, WavFormat};
use runtime::{Engine, EngineOptions, Event, Session, SessionOptions, SessionRunner};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut args = std::env::args().skip(1);
    let bundle = args
        .next()
        .map_or_else(|| root.join("fixtures/lm"), PathBuf::from);
    let input = args
        .next()
        .map_or_else(|| root.join("fixtures/duplex/input.wav"), PathBuf::from);
    let output = args
        .next()
        .map_or_else(|| root.join("target/duplex-example.wav"), PathBuf::from);

    // 1. The resident weights, shared by every session of the process.
    let engine = Engine::open(&bundle, EngineOptions::cpu(1))?;
    // 2. One conversation: all its state is allocated here. Output at 48 kHz (resampled inside the session).
    let opts = SessionOptions {
        output_rate: 48_000,
        max_queued_frames: 8,
        ..Default::default()
    };
    let session = Session::new(engine, opts)?;
    // 3. Drive it on a worker thread; take the input, command and output ends.
    let mut runner = SessionRunner::spawn(session, 16)?;
    let mut mic = runner.producer().expect("first call");
    let control = runner.control();
    let events = runner.events().expect("first call");

    // 4. The "microphone": 24 kHz mono in 20 ms chunks, paced at twice real time. `push` never blocks; if the
    //    model falls behind, the oldest queued frames are dropped and counted.
    let pcm = read_wav(&input)?.samples;
    let half = pcm.len().div_ceil(480) / 2;
    let mic_thread = std::thread::spawn(move || {
        for (i, chunk) in pcm.chunks(480).enumerate() {
            mic.push(chunk);
            if i == half {
                // 5. Soft interrupt: the model keeps its state; output of the old epoch is discarded.
                let epoch = control.interrupt();
                eprintln!("interrupt → epoch {epoch}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });

    // 6. Collect events until the input is done and the queue has drained.
    let (mut audio, mut text) = (Vec::new(), String::new());
    loop {
        match events.recv_timeout(Duration::from_millis(500)) {
            Ok(Event::Frame(f)) => {
                audio.extend_from_slice(&f.pcm);
                text.push_str(&f.text);
                if f.frame_index % 8 == 0 {
                    eprintln!(
                        "frame {:3} epoch {} text {:?} step {} µs, queued {}, dropped {}",
                        f.frame_index,
                        f.epoch,
                        f.text,
                        f.timings.total_us,
                        f.counters.queued,
                        f.counters.frames_dropped
                    );
                }
            }
            Ok(Event::Stopped(reason)) => {
                eprintln!("stopped: {reason:?}");
                break;
            }
            Ok(Event::Error(e)) => return Err(e.into()),
            Err(_) if mic_thread.is_finished() => break, // input over and nothing more came
            Err(_) => {}
        }
    }
    mic_thread.join().expect("mic thread");
    // 7. Stop joins the worker exactly once (also done by Drop).
    let counters = runner.stop()?;
    eprintln!("{counters:?}");
    println!("text: {text}");
    write_wav_mono(&output, &audio, 48_000, WavFormat::F32)?;
    println!(
        "wrote {} samples at 48 kHz to {}",
        audio.len(),
        output.display()
    );
    Ok(())
}
