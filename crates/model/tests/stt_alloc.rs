//! The speech-to-text tick after warm-up allocates nothing on any thread (the stepping thread and the
//! pool's workers), the ticks that emit words included (a word's tokens travel inline in its event,
//! `model::stt::WordTokens`): one batched 32-codebook Mimi encode
//! and one `SttBatch` step (temporal transformer, text argmax, extra heads, word rules) per tick, as
//! `runtime::SttRunner` runs them, with streams joining (row and encoder stream reset), leaving (not
//! stepped) and resetting at any tick. Counted with the all-thread counter, so this binary holds a
//! single test.

use std::sync::Arc;

use kernels::Pool;
use model::checkpoint::Bundle;
use model::lm::KvDtype;
use model::mimi::MimiBatchEncoder;
use model::stt::{SttEvent, SttModel};

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

const FRAME: usize = 1920;
const SLOTS: usize = 4;

/// Which slots a tick steps and which join (fresh stream) right before it: slot 0 throughout,
/// slot 1 joins at tick 4 and leaves at 30, slot 2 joins at 10, is reset at 22 and leaves at 36,
/// slot 3 joins at 16, leaves at 24 and a new stream takes the slot at 28; a tick with slot 0 alone
/// (40..44) and one with slots 0 and 3 only between.
fn schedule(t: usize) -> (Vec<usize>, Vec<usize>) {
    let mut rows = vec![0];
    let mut joins = Vec::new();
    for (slot, from, to) in [(1, 4, 30), (2, 10, 36), (3, 16, 24), (3, 28, 40)] {
        if (from..to).contains(&t) {
            rows.push(slot);
        }
        if t == from {
            joins.push(slot);
        }
    }
    if t == 22 {
        joins.push(2);
    }
    rows.sort_unstable();
    (rows, joins)
}

#[test]
fn stt_ticks_allocate_nothing_after_warmup_words_included() {
    assert!(testkit::other_thread_probe(|f| testkit::all_thread_allocations_during(f)) >= 1);
    let dir = testkit::fixtures_dir("stt").join("1b");
    let b = Bundle::open(&dir).unwrap();
    let pool = Arc::new(Pool::new(2));
    let model = Arc::new(SttModel::load(&b, &pool).unwrap());
    let pcm = testkit::read_wav_f32(dir.join("input.wav"));
    let frames = pcm.len() / FRAME;
    assert!(frames >= 8);
    let mut words_seen = 0;
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        let mut batch = model.cpu_batch(SLOTS, kv, pool.clone()).unwrap();
        let mut enc = MimiBatchEncoder::new(model.mimi().clone(), SLOTS);
        let mut events: Vec<(usize, SttEvent)> = Vec::with_capacity(16 * SLOTS);
        let mut buf = vec![0.0f32; SLOTS * FRAME];
        let all: Vec<usize> = (0..SLOTS).collect();
        // Warm-up as the runner's: two ticks of every slot, then every slot reset.
        for _ in 0..2 {
            events.clear();
            let codes = enc.encode_frames(&all, &buf, Some(&pool)).unwrap();
            batch.step(&all, codes, &mut events).unwrap();
        }
        for s in 0..SLOTS {
            enc.reset(s);
            batch.reset_row(s);
        }
        let mut rows = Vec::with_capacity(SLOTS);
        // Each slot's frame index since its stream started.
        let mut pos = [0usize; SLOTS];
        for t in 0..44 {
            let (r, joins) = schedule(t);
            for &s in &joins {
                enc.reset(s);
                batch.reset_row(s);
                pos[s] = 0;
            }
            rows.clear();
            rows.extend_from_slice(&r);
            for (i, &s) in rows.iter().enumerate() {
                // Slot s plays the clip from its start, shifted by s frames, looping.
                let f = (pos[s] + s) % frames;
                buf[i * FRAME..(i + 1) * FRAME].copy_from_slice(&pcm[f * FRAME..(f + 1) * FRAME]);
                pos[s] += 1;
            }
            let n = rows.len();
            let mut words = 0;
            let allocs = testkit::all_thread_allocations_during(|| {
                events.clear();
                let codes = enc
                    .encode_frames(&rows, &buf[..n * FRAME], Some(&pool))
                    .unwrap();
                batch.step(&rows, codes, &mut events).unwrap();
                words = events
                    .iter()
                    .filter(|(_, e)| matches!(e, SttEvent::Word { .. }))
                    .count();
            });
            assert_eq!(
                allocs, 0,
                "{kv:?} tick {t} ({n} streams {rows:?}, {words} words): allocations"
            );
            words_seen += words;
        }
    }
    // The word path ran under the count.
    assert!(words_seen > 0, "no word in the schedule");
}
