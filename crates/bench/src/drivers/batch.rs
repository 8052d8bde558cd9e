//! `moshi-native bench batch`: the server's batch of conversation slots against the same conversations run
//! one by one, in the same run, interleaved round by round.
//!
//! * Mimi: a tick in which each of `--slots N` streams encodes and decodes one 80 ms frame, coded jointly
//!   (`MimiBatchEncoder` / `MimiBatchDecoder`: every weight read once per tick) and one stream after the
//!   other (N `MimiEncoder` / `MimiDecoder`, what `serve --batch` did before), against one stream alone.
//!   `ratio_to_one` = joint (or sequential) tick ÷ one-stream tick, the median of the per-round ratios.
//! * Server tick (with `--bundle`): one tick of a batch of N slots (`runtime::BatchBench`: commands, joint
//!   encode, one LM step for N rows, joint decode, detokenize, resample, emit) against N single `Session`s
//!   each stepping one frame, one after the other, on the same thread count.
//!
//! Result lines: `result impl=ours what=mimi_slots|server_tick slots=N mode=one|joint|sequential|batch|
//! sessions threads=T ms=... min=... max=... ratio_to_one=... n=...`.

use std::sync::Arc;
use std::time::Instant;

use crate::mimi::{stage_breakdown_slots, time_slot_ticks, SlotMode};
use anyhow::{bail, Result};
use kernels::Pool;
use model::mimi::Mimi;
use runtime::{BatchBench, Engine, EngineOptions, Session, SessionOptions, FRAME_SIZE};

use super::args::{ratio_fields, settle, stats, BenchArgs};

/// One timed configuration: its samples (ms per tick) and its per-round ratios to the one-stream cell.
#[derive(Default, Clone)]
struct Cell {
    ms: Vec<f64>,
    ratio: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    stats(v).0
}

fn print_cell(what: &str, slots: usize, mode: &str, threads: usize, c: &Cell) {
    let (m, lo, hi) = stats(&c.ms);
    let ratio = ratio_fields(&c.ratio, ["ratio_to_one", "ratio_min", "ratio_max"]);
    println!(
        "result impl=ours what={what} slots={slots} mode={mode} threads={threads} ms={m:.3} min={lo:.3} max={hi:.3}{ratio} n={}",
        c.ms.len()
    );
}

/// Runs `bench batch`.
pub fn run(args: &BenchArgs, pools: &[Pool]) -> Result<()> {
    let slots = args.slots;
    if slots < 2 {
        bail!("bench batch needs --slots of at least 2");
    }
    let mimi = match &args.bundle {
        Some(dir) => {
            let b = model::checkpoint::Bundle::open(dir)?;
            let w = b.mimi_weights()?;
            Arc::new(Mimi::load(&w, &b.mimi_config, 8)?)
        }
        None => crate::mimi::synthetic_mimi(8, 42)?,
    };
    bench_mimi_slots(args, pools, &mimi)?;
    drop(mimi);
    match &args.bundle {
        Some(dir) => {
            for &threads in &args.threads {
                bench_server_tick(args, dir, threads)?;
            }
        }
        None => println!("\n(server tick skipped: it needs --bundle DIR for the LM)"),
    }
    Ok(())
}

fn bench_mimi_slots(args: &BenchArgs, pools: &[Pool], mimi: &Arc<Mimi>) -> Result<()> {
    let slots = args.slots;
    let ticks = args.mimi_frames.max(2);
    // The 1-thread path runs without a pool, as the runtime does for threads = 1.
    let pool_of = |pi: usize| (args.threads[pi] > 1).then_some(&pools[pi]);
    let modes = [
        ("one", 1, SlotMode::Joint),
        ("joint", slots, SlotMode::Joint),
        ("sequential", slots, SlotMode::Sequential),
    ];
    for pi in 0..pools.len() {
        for &(_, n, mode) in &modes {
            time_slot_ticks(mimi, n, mode, 2, pool_of(pi))?;
        }
    }
    let mut cells = vec![vec![Cell::default(); modes.len()]; pools.len()];
    for _ in 0..args.rounds {
        for (pi, row) in cells.iter_mut().enumerate() {
            let mut round = [0.0; 3];
            for (mi, &(_, n, mode)) in modes.iter().enumerate() {
                settle();
                let (e, d) = time_slot_ticks(mimi, n, mode, ticks, pool_of(pi))?;
                let ms: Vec<f64> = e.iter().zip(&d).map(|(a, b)| a + b).collect();
                round[mi] = median(&ms);
                row[mi].ms.extend(ms);
            }
            for mi in 1..modes.len() {
                row[mi].ratio.push(round[mi] / round[0]);
            }
        }
    }
    println!(
        "\n## mimi: one tick = every slot encodes + decodes one 80 ms frame, ms ({ticks} ticks x {} rounds)",
        args.rounds
    );
    for (pi, row) in cells.iter().enumerate() {
        for (mi, &(label, n, _)) in modes.iter().enumerate() {
            print_cell("mimi_slots", n, label, args.threads[pi], &row[mi]);
        }
    }
    println!(
        "\n## mimi: mean ms per tick by stage, one slot and {slots} joint slots ({ticks} ticks)"
    );
    for pi in 0..pools.len() {
        for n in [1, slots] {
            let stages = stage_breakdown_slots(mimi, n, ticks, pool_of(pi))?;
            let total: f64 = stages.iter().map(|s| s.1).sum();
            let parts: Vec<String> = stages.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
            println!(
                "threads={} slots={n}: total {total:.1} ms = {}",
                args.threads[pi],
                parts.join(", ")
            );
        }
    }
    Ok(())
}

fn bench_server_tick(args: &BenchArgs, dir: &std::path::Path, threads: usize) -> Result<()> {
    let slots = args.slots;
    let t0 = Instant::now();
    let engine = Engine::open(dir, EngineOptions::cpu(threads))?;
    eprintln!(
        "server tick: engine opened ({}) in {:.1} s",
        dir.display(),
        t0.elapsed().as_secs_f64()
    );
    let opts = SessionOptions::default();
    let ticks = args.lm_frames.max(1);
    let total = 2 + args.rounds * ticks;
    // KV caches sized to the run: positions stay below the capacity, so every step attends over the
    // same entries as in a full-context session, while 2 × slots full f32 caches (3.1 GB each for
    // Moshi) would not fit next to the weights on a small machine.
    let kv_capacity = total + 1;
    let mut batch = BatchBench::new(&engine, slots, &opts, kv_capacity)?;
    let mut sessions: Vec<Session> = (0..slots)
        .map(|_| Session::with_kv_capacity(engine.clone(), opts.clone(), kv_capacity))
        .collect::<Result<_, _>>()?;
    let signal = crate::mimi::test_signal((total + slots) * FRAME_SIZE, 24_000);
    // Slot j's frame of tick k: the signal from frame k + j on.
    let mut frames = vec![0.0; slots * FRAME_SIZE];
    let fill = |k: usize, frames: &mut [f32]| {
        for j in 0..slots {
            frames[j * FRAME_SIZE..(j + 1) * FRAME_SIZE]
                .copy_from_slice(&signal[(k + j) * FRAME_SIZE..(k + j + 1) * FRAME_SIZE]);
        }
    };
    let step_sessions = |sessions: &mut [Session], frames: &[f32]| -> Result<usize> {
        let mut n = 0;
        for (j, s) in sessions.iter_mut().enumerate() {
            s.push_pcm(&frames[j * FRAME_SIZE..(j + 1) * FRAME_SIZE])?;
            if matches!(s.step()?, runtime::Step::Frame(_)) {
                n += 1;
            }
        }
        Ok(n)
    };
    // Warm-up: two ticks each (the first frame is the Python server's reset frame).
    for k in 0..2 {
        fill(k, &mut frames);
        batch.tick(&frames)?;
        step_sessions(&mut sessions, &frames)?;
    }
    let (mut b, mut s) = (Cell::default(), Cell::default());
    let mut k = 2;
    for _ in 0..args.rounds {
        let (mut rb, mut rs) = (Vec::new(), Vec::new());
        for _ in 0..ticks {
            fill(k, &mut frames);
            settle();
            let t = Instant::now();
            let n = batch.tick(&frames)?;
            rb.push(t.elapsed().as_secs_f64() * 1e3);
            settle();
            let t = Instant::now();
            let m = step_sessions(&mut sessions, &frames)?;
            rs.push(t.elapsed().as_secs_f64() * 1e3);
            if n != slots || m != slots {
                bail!("a tick produced {n} (batch) / {m} (sessions) frames for {slots} slots");
            }
            k += 1;
        }
        b.ratio.push(median(&rb) / median(&rs));
        b.ms.extend(rb);
        s.ms.extend(rs);
    }
    println!(
        "\n## server tick: {slots} conversations, one frame each, ms ({ticks} ticks x {} rounds, {threads} thread(s)); ratio_to_one = batch tick / {slots} single sessions",
        args.rounds
    );
    print_cell("server_tick", slots, "batch", threads, &b);
    print_cell("server_tick", slots, "sessions", threads, &s);
    Ok(())
}
