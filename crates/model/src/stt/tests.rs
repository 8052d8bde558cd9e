//! Parity with the oracle fixtures (`fixtures/stt/{1b,2b6}/`, `tools/oracle/gen_stt.py`, moshi 0.2.13,
//! f32, greedy `LMGen.step_with_extra_heads`, Kyutai's word rules).

use std::sync::Arc;

use kernels::Pool;
use testkit::TensorFile;

use super::testing::{
    assert_events, events_json, fixture_dir as dir, load as model, transcribe, VARIANTS,
};
use super::*;
use crate::checkpoint::Bundle;

/// The LM step, extra heads and word rules fed the oracle's Mimi codes: input tokens, text tokens
/// and every event exact, text logits and head probabilities within 1e-4.
#[test]
fn stt_step_matches_oracle_from_codes() {
    for v in VARIANTS {
        let m = model(v);
        let tr = TensorFile::open(dir(v).join("trace.safetensors"));
        let (codes, cs) = tr.i64("codes");
        let (inputs, _) = tr.i64("input_tokens");
        let (logits, _) = tr.f32("text_logits");
        let (text, _) = tr.i64("text_tokens");
        let heads = m.n_heads() > 0;
        let probs = heads.then(|| tr.f32("extra_heads").0);
        let (nq, steps) = (cs[0], cs[1]);
        let spec = m.lm().spec().clone();
        let (k, tc, hw) = (
            spec.num_streams(),
            spec.text_card,
            m.n_heads() * m.head_dim(),
        );
        let mut batch = m
            .cpu_batch(1, crate::lm::KvDtype::F32, Arc::new(Pool::new(1)))
            .unwrap();
        let mut events = Vec::new();
        let mut max_logit = 0f32;
        let mut max_prob = 0f32;
        for t in 0..steps {
            let col: Vec<u32> = (0..nq).map(|q| codes[q * steps + t] as u32).collect();
            batch.step(&[0], &col, &mut events).unwrap();
            let want_in: Vec<u32> = inputs[t * k..(t + 1) * k]
                .iter()
                .map(|&x| x as u32)
                .collect();
            assert_eq!(
                batch.last_inputs(),
                &want_in[..],
                "{v} step {t}: input tokens"
            );
            assert_eq!(
                batch.text_tokens()[0],
                Some(text[t] as u32),
                "{v} step {t}: text"
            );
            let got = LmBackend::text_logits(batch.backend());
            for (a, b) in got.iter().zip(&logits[t * tc..(t + 1) * tc]) {
                max_logit = max_logit.max((a - b).abs());
            }
            if let Some(p) = &probs {
                for (a, b) in batch.head_probs().iter().zip(&p[t * hw..(t + 1) * hw]) {
                    max_prob = max_prob.max((a - b).abs());
                }
            }
        }
        assert!(max_logit < 1e-4, "{v}: text logits differ by {max_logit}");
        assert!(
            max_prob < 1e-4,
            "{v}: head probabilities differ by {max_prob}"
        );
        let got: Vec<SttEvent> = events.into_iter().map(|(_, e)| e).collect();
        let want = events_json(v);
        assert_events(&got, &want["events"], 1e-4, v);
        assert!(
            got.iter().any(|e| matches!(e, SttEvent::Word { .. })),
            "{v}: no word"
        );
    }
}

use crate::lm::LmBackend;

/// The whole path from the input WAV's PCM: silence prefix, Mimi's streaming encoder with 32
/// codebooks, the step, the flush; the codes, text tokens and events are the oracle's.
#[test]
fn stt_stream_from_pcm_matches_oracle() {
    for v in VARIANTS {
        let m = model(v);
        let tr = TensorFile::open(dir(v).join("trace.safetensors"));
        let (codes, cs) = tr.i64("codes");
        let (text, _) = tr.i64("text_tokens");
        let (nq, steps) = (cs[0], cs[1]);
        let pcm = testkit::read_wav_f32(dir(v).join("input.wav"));
        let mut s = SttStream::cpu(&m, Arc::new(Pool::new(1))).unwrap();
        let (got_text, got_codes, got_events) = transcribe(&mut s, &pcm);
        assert_eq!(got_text.len(), steps, "{v}: steps");
        // Step t >= 1 feeds frame t's codes (step 0 feeds initial tokens).
        for t in 1..steps {
            let want: Vec<u32> = (0..nq).map(|q| codes[q * steps + t] as u32).collect();
            assert_eq!(got_codes[t], want, "{v}: codes of frame {t}");
        }
        assert_eq!(got_text, text, "{v}: text tokens");
        assert_events(&got_events, &events_json(v)["events"], 1e-4, v);
    }
}

/// The word rules alone on a crafted token stream covering every case (the oracle's restatement
/// of Kyutai's rules gives the expected events).
#[test]
fn word_rules_match_oracle_on_crafted_tokens() {
    let j = events_json("1b");
    let toks: Vec<u32> = serde_json::from_value(j["crafted_tokens"].clone()).unwrap();
    let skip = (j["crafted_delay_tokens"].as_u64().unwrap() + j["crafted_prefix"].as_u64().unwrap())
        as usize;
    let mut w = WordAssembler::new(skip, 3, 0, FRAME_RATE);
    let mut got = Vec::new();
    for t in toks {
        w.push(t, &[], |e| got.push(e));
    }
    assert_events(&got, &j["crafted_events"], 0.0, "crafted");
    assert!(got.iter().any(|e| matches!(e, SttEvent::EndWord { .. })));
}

/// The pending word's cap (our rule, not Kyutai's: `words.rs` docs). Kyutai's rules would close one
/// word of the whole run at the EPAD; capped, the run leaves as words of [`MAX_WORD_TOKENS`] tokens,
/// each emitted on the step its successor's first token arrives, then the rest at the EPAD: in
/// order, the run's tokens exactly, all starting at the run's start, one `EndWord` after them. A run
/// of exactly the cap is one word, and a stream that never ends a word keeps emitting capped words.
#[test]
fn word_cap_splits_long_runs_and_loses_nothing() {
    let (skip, pad, epad) = (2usize, 3u32, 0u32);
    for run in [
        1,
        MAX_WORD_TOKENS - 1,
        MAX_WORD_TOKENS,
        MAX_WORD_TOKENS + 1,
        2 * MAX_WORD_TOKENS + 5,
    ] {
        let mut w = WordAssembler::new(skip, pad, epad, FRAME_RATE);
        // skip steps, PADs, an EPAD at step e0, the run, then an EPAD closing it at step e1.
        let mut toks = vec![pad; skip + 3];
        toks.push(epad);
        let e0 = toks.len();
        let words: Vec<u32> = (0..run as u32).map(|i| 100 + i).collect();
        toks.extend_from_slice(&words);
        toks.push(epad);
        let e1 = toks.len();
        let mut got: Vec<(usize, SttEvent)> = Vec::new();
        for (i, &t) in toks.iter().enumerate() {
            w.push(t, &[], |e| got.push((i + 1, e)));
            assert!(
                w.pending().len() <= MAX_WORD_TOKENS,
                "run {run}: pending grew"
            );
        }
        let t0 = (e0 - skip) as f64 / FRAME_RATE;
        let mut seen = Vec::new();
        let n_words = run.div_ceil(MAX_WORD_TOKENS);
        assert_eq!(got.len(), n_words + 1, "run {run}: {got:?}");
        for (k, (step, e)) in got[..n_words].iter().enumerate() {
            let SttEvent::Word { tokens, start_time } = e else {
                panic!("run {run}: event {k} is {e:?}");
            };
            assert_eq!(*start_time, t0, "run {run}: word {k} start");
            let want_len = if k + 1 < n_words {
                MAX_WORD_TOKENS
            } else {
                run - k * MAX_WORD_TOKENS
            };
            assert_eq!(tokens.len(), want_len, "run {run}: word {k} length");
            // A full word leaves when the next token arrives; the last one at the closing EPAD.
            let want_step = if k + 1 < n_words {
                e0 + (k + 1) * MAX_WORD_TOKENS + 1
            } else {
                e1
            };
            assert_eq!(*step, want_step, "run {run}: word {k} step");
            seen.extend_from_slice(tokens);
        }
        assert_eq!(seen, words, "run {run}: tokens lost or reordered");
        assert_eq!(
            got[n_words],
            (
                e1,
                SttEvent::EndWord {
                    stop_time: (e1 - skip) as f64 / FRAME_RATE
                }
            ),
            "run {run}"
        );
    }
    // A model that never closes a word: one capped word every MAX_WORD_TOKENS steps, bounded state.
    let mut w = WordAssembler::new(0, 3, 0, FRAME_RATE);
    let mut n = 0;
    for i in 0..10 * MAX_WORD_TOKENS + 1 {
        w.push(7 + (i % 5) as u32, &[], |e| {
            assert!(matches!(e, SttEvent::Word { tokens, .. } if tokens.is_full()));
            n += 1;
        });
    }
    assert_eq!(n, 10);
    assert_eq!(w.pending().len(), 1);
}

/// The inline token list holds exactly [`MAX_WORD_TOKENS`] ids and refuses more.
#[test]
fn word_tokens_hold_the_cap() {
    let ids: Vec<u32> = (0..MAX_WORD_TOKENS as u32 + 1).collect();
    let full = WordTokens::from_slice(&ids[..MAX_WORD_TOKENS]).unwrap();
    assert_eq!(&full[..], &ids[..MAX_WORD_TOKENS]);
    assert!(full.is_full());
    assert!(WordTokens::from_slice(&ids).is_none());
    let mut w = full;
    assert!(!w.push(1));
    assert_eq!(w, full);
    w.clear();
    assert!(w.push(9));
    assert_eq!(&w[..], &[9]);
}

/// Both fixture bundles parse as STT configs with the plan the oracle used.
#[test]
fn fixture_plans_are_the_oracles() {
    for v in VARIANTS {
        let b = Bundle::open(&dir(v)).unwrap();
        let plan = SttPlan::from_config(b.config.stt.as_ref().unwrap());
        let j = &events_json(v)["plan"];
        assert_eq!(
            plan.prefix_frames as u64,
            j["prefix"].as_u64().unwrap(),
            "{v}"
        );
        assert_eq!(
            plan.delay_tokens as u64,
            j["delay_tokens"].as_u64().unwrap(),
            "{v}"
        );
        assert_eq!(
            plan.flush_frames as u64,
            j["flush"].as_u64().unwrap(),
            "{v}"
        );
        assert_eq!(b.config.lm.dep_q, 0);
        assert_eq!(b.config.lm.n_q, 32);
    }
}
