use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;
use unsafe_libopus as ul;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}
#[global_allocator]
static A: Counting = Counting;

fn packets(path: &str) -> Vec<Vec<u8>> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut bytes = Vec::new();
    for m in v["messages"].as_array().unwrap() {
        bytes.extend(hex::decode(m.as_str().unwrap()).unwrap());
    }
    let mut r = ogg::PacketReader::new(std::io::Cursor::new(bytes));
    let mut out = Vec::new();
    while let Some(p) = r.read_packet().unwrap() {
        if p.data.starts_with(b"OpusHead") || p.data.starts_with(b"OpusTags") {
            continue;
        }
        out.push(p.data);
    }
    out
}

fn snr(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    let (mut s, mut e) = (0f64, 0f64);
    for i in 0..n {
        s += (a[i] as f64).powi(2);
        e += ((a[i] - b[i]) as f64).powi(2);
    }
    10.0 * (s / e.max(1e-30)).log10()
}

/// Usage: `opuseval [INTEROP_DIR] [SPEECH_WAV]` — the recorded client traffic (default: the repository's
/// `fixtures/interop`) and a 48 kHz 16-bit mono WAV for the encoder comparison (default: the shared
/// `speech-like-48k.wav` next to the clone).
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).map_or("../../fixtures/interop", String::as_str);
    let wav_path = args.get(2).map_or(
        "../../../shared/interop/speech-like-48k.wav",
        String::as_str,
    );
    for f in [
        "kyutai-web-client-upstream.json",
        "sphn-client-upstream.json",
    ] {
        let pk = packets(&format!("{dir}/{f}"));
        let mut c = opus::Decoder::new(24000, opus::Channels::Mono).unwrap();
        let mut pc = Vec::new();
        let mut buf = vec![0f32; 2880];
        let t = Instant::now();
        for p in &pk {
            let n = c.decode_float(p, &mut buf, false).unwrap();
            pc.extend_from_slice(&buf[..n]);
        }
        let tc = t.elapsed();
        let mut err = 0;
        let d = unsafe { ul::opus_decoder_create(24000, 1, &mut err) };
        let mut pr = Vec::new();
        let a0 = ALLOCS.load(Relaxed);
        let t = Instant::now();
        for p in &pk {
            let n = unsafe {
                ul::opus_decode_float(d, p.as_ptr(), p.len() as i32, buf.as_mut_ptr(), 2880, 0)
            };
            assert!(n > 0, "{n}");
            pr.extend_from_slice(&buf[..n as usize]);
        }
        let tr = t.elapsed();
        let allocs = ALLOCS.load(Relaxed) - a0;
        let mut od = opus_rs::OpusDecoder::new(24000, 1).unwrap();
        let mut po = Vec::new();
        let a0 = ALLOCS.load(Relaxed);
        let t = Instant::now();
        for p in &pk {
            let n = od.decode(p, 2880, &mut buf).unwrap();
            po.extend_from_slice(&buf[..n]);
        }
        let to = t.elapsed();
        let allocs_o = ALLOCS.load(Relaxed) - a0;
        let secs = pc.len() as f64 / 24000.0;
        println!(
            "  opus-rs: {} samples, SNR vs C {:.1} dB, decode per 80ms {:.3} ms, allocs {}",
            po.len(),
            snr(&pc, &po),
            to.as_secs_f64() * 1e3 / (secs / 0.08),
            allocs_o
        );
        let maxdiff = pc
            .iter()
            .zip(&pr)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let secs = pc.len() as f64 / 24000.0;
        println!(
            "{f}: {} packets, {} samples C / {} samples Rust; max |diff| {maxdiff:e}; SNR(rust vs C) {:.1} dB; decode per 80ms: C {:.3} ms, Rust {:.3} ms; rust allocs {} ({:.1}/packet)",
            pk.len(),
            pc.len(),
            pr.len(),
            snr(&pc, &pr),
            tc.as_secs_f64() * 1e3 / (secs / 0.08),
            tr.as_secs_f64() * 1e3 / (secs / 0.08),
            allocs,
            allocs as f64 / pk.len() as f64
        );
    }
    // encode: 10 s speech-like at 24 kHz (decimate 48k wav by 2 crude)
    let wav = std::fs::read(wav_path).unwrap();
    let pcm48: Vec<f32> = wav[44..]
        .chunks(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0)
        .collect();
    let pcm: Vec<f32> = pcm48
        .chunks(2)
        .map(|c| 0.5 * (c[0] + c.get(1).copied().unwrap_or(0.0)))
        .collect();
    let frames = pcm.len() / 960;
    let mut ce = opus::Encoder::new(24000, opus::Channels::Mono, opus::Application::Voip).unwrap();
    let mut pkt = vec![0u8; 4000];
    let mut cpk = Vec::new();
    let t = Instant::now();
    for i in 0..frames {
        let n = ce
            .encode_float(&pcm[i * 960..(i + 1) * 960], &mut pkt)
            .unwrap();
        cpk.push(pkt[..n].to_vec());
    }
    let tc = t.elapsed();
    let mut err = 0;
    let e = unsafe { ul::opus_encoder_create(24000, 1, ul::OPUS_APPLICATION_VOIP, &mut err) };
    let mut rpk = Vec::new();
    let mut allocs = 0;
    let t = Instant::now();
    for i in 0..frames {
        let a0 = ALLOCS.load(Relaxed);
        let n = unsafe {
            ul::opus_encode_float(e, pcm[i * 960..].as_ptr(), 960, pkt.as_mut_ptr(), 4000)
        };
        allocs += ALLOCS.load(Relaxed) - a0;
        assert!(n > 0);
        rpk.push(pkt[..n as usize].to_vec());
    }
    let tr = t.elapsed();
    let same = cpk.iter().zip(&rpk).filter(|(a, b)| a == b).count();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / (frames as f64 / 2.0);
    let bytes: usize = rpk.iter().map(|p| p.len()).sum();
    println!(
        "encode {frames} x 40ms: identical packets {same}/{frames}; per 80ms: C {:.3} ms, Rust {:.3} ms; rust allocs {allocs} ({:.1}/packet); {:.1} kbit/s",
        per(tc),
        per(tr),
        allocs as f64 / frames as f64,
        bytes as f64 * 8.0 / (frames as f64 * 0.04) / 1000.0
    );
    // decode rust packets with C, SNR vs input
    let mut c = opus::Decoder::new(24000, opus::Channels::Mono).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0f32; 2880];
    for p in &rpk {
        let n = c.decode_float(p, &mut buf, false).unwrap();
        out.extend_from_slice(&buf[..n]);
    }
    let mut oe = opus_rs::OpusEncoder::new(24000, 1, opus_rs::Application::Voip).unwrap();
    oe.bitrate_bps = 25500;
    let mut opk = Vec::new();
    let mut oallocs = 0;
    let t = Instant::now();
    for i in 0..frames {
        let a0 = ALLOCS.load(Relaxed);
        let n = oe
            .encode(&pcm[i * 960..(i + 1) * 960], 960, &mut pkt)
            .unwrap();
        oallocs += ALLOCS.load(Relaxed) - a0;
        opk.push(pkt[..n].to_vec());
    }
    let to = t.elapsed();
    let obytes: usize = opk.iter().map(|p| p.len()).sum();
    println!(
        "opus-rs encode per 80ms {:.3} ms, allocs {oallocs}, {:.1} kbit/s",
        per(to),
        obytes as f64 * 8.0 / (frames as f64 * 0.04) / 1000.0
    );
    let best = |pk: &Vec<Vec<u8>>| {
        let mut c = opus::Decoder::new(24000, opus::Channels::Mono).unwrap();
        let mut out = Vec::new();
        let mut buf = vec![0f32; 2880];
        for p in pk {
            let n = c.decode_float(p, &mut buf, false).unwrap();
            out.extend_from_slice(&buf[..n]);
        }
        (0..2000)
            .map(|la| snr(&pcm[..out.len() - la], &out[la..]))
            .fold(f64::MIN, f64::max)
    };
    println!(
        "best-lag SNR vs input, decoded by libopus: C-enc {:.1} dB, unsafe-libopus-enc {:.1} dB, opus-rs-enc {:.1} dB",
        best(&cpk),
        best(&rpk),
        best(&opk)
    );
    let la = ce.get_lookahead().unwrap() as usize;
    println!(
        "rust-encoded -> C decoded, SNR vs input (lookahead {la}): {:.1} dB",
        snr(&pcm[..out.len() - la], &out[la..])
    );
}
