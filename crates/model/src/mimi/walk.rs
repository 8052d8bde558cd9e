//! The CPU walks the plan (`plan.rs`): [`SideState`] holds one side's streaming state for a set
//! of streams (per step: the convolution histories, transposed-convolution tails, residual
//! units' states; the transformer's KV rings and positions; the RVQ's scratch) and the buffers of
//! one call, all made when the state is; a call walks the side's steps, one `match` arm each, and
//! allocates nothing.
//!
//! A call runs the streams listed in `active`. The side has two parts: the SEANet's high-rate
//! steps (the encoder's first, the decoder's last: [`CHAIN_MIN`]), which each stream runs on its
//! own as one *chain* with its own states and buffers, and the rest, which runs all the streams
//! together, their activations side by side (`[C, m·T]`, see `conv.rs`), with one state per
//! stream and step and the work buffers of one call for all of them. One stream is the plain
//! streaming case of both. Which steps form the chain is the CPU's grouping, not the plan's: it
//! follows from the steps' sizes.

use std::ops::Range;

use super::conv::{ConvState, ConvTrState, ConvWork, SyncPtr};
use super::plan::{Flow, Side, Step};
use super::quantizer::QuantScratch;
use super::seanet::{ResBlock, ResState};
use super::transformer::TransformerState;
use super::{report, Mimi, Trace};
use kernels::conv::Workspace;
use kernels::Pool;

/// Above this many activation values per stream (a step's input or output), a SEANet step at
/// the high-rate end of its side belongs to the chain, which each stream runs on its own.
///
/// Several streams run layer by layer through the high-rate stages hold megabytes of
/// activations per layer (4 streams of a 1920-sample layer: ~2 MB in, ~1 MB out), and on a pool
/// every layer hands each stream's data from core to core. Run as a chain, one stream through
/// all its high-rate layers, on a pool whole streams go to the threads: one dispatch for the
/// chain, each stream's data in one core. Measured for 4 slots on 2 threads: the SEANets cost
/// 2.35–2.45× one slot's instead of 2.65–2.96× (`docs/bench-log.md`); on one thread the order makes
/// no measurable difference. Their weights are small and stay in cache, so nothing is lost by
/// not sharing them. The low-rate steps, whose weights outweigh their activations, keep
/// running all streams together (each weight read once).
const CHAIN_MIN: usize = 32 * 1024;

/// Per-stream states of one step (indexed by stream; a chain's by 0).
#[derive(Debug)]
enum StepState {
    /// A step with no state of its own (taps, the RVQ; the transformer's is [`SideState::tr`]).
    None,
    Conv(Vec<ConvState>),
    ConvTr(Vec<ConvTrState>),
    Res(ResState),
}

impl StepState {
    fn reset(&mut self, i: usize) {
        match self {
            StepState::None => {}
            StepState::Conv(s) => s[i].reset(),
            StepState::ConvTr(s) => s[i].reset(),
            StepState::Res(s) => ResBlock::reset(s, i),
        }
    }
}

/// Work buffers of one call: `a`/`b` the activations (ping-pong: a step reads `a` and leaves its
/// output in `a`), `h`/`r` a residual unit's scratch.
#[derive(Debug)]
struct Scratch {
    work: ConvWork,
    a: Vec<f32>,
    b: Vec<f32>,
    h: Vec<f32>,
    r: Vec<f32>,
}

/// The steps `range` of a side for some number of streams: their states and work buffers.
#[derive(Debug)]
struct Part {
    range: Range<usize>,
    states: Vec<StepState>,
    s: Scratch,
}

/// One stream's chain: its steps' one-stream states and buffers, and (encoder) its input.
#[derive(Debug)]
struct Chain {
    part: Part,
    io: Vec<f32>,
}

/// What [`each_chain`] runs for one stream: `(its chain, its place j in the call, the
/// pool the chain may use)`.
type ChainFn<'a> = dyn Fn(&mut Chain, usize, Option<&Pool>) + Sync + 'a;

/// What a part reads and writes besides its activations: the side's input (PCM before the first
/// step, codes for the RVQ decode), the transformer state, the RVQ's scratch and its codes out.
#[derive(Default)]
struct Io<'a> {
    pcm: Option<&'a [f32]>,
    codes_in: &'a [u32],
    tr: Option<&'a mut TransformerState>,
    quant: Option<&'a mut QuantScratch>,
    codes_out: &'a mut [u32],
}

/// One side's streaming state for `streams` streams and calls of at most `chunk` frames each.
#[derive(Debug)]
pub(crate) struct SideState {
    side: Side,
    /// Per step, what it reads and writes per frame (the plan's [`MimiPlan::flow`]).
    ///
    /// [`MimiPlan::flow`]: super::plan::MimiPlan::flow
    flows: Vec<(Flow, Flow)>,
    /// The steps that run all active streams at once.
    joined: Part,
    /// The high-rate chain's steps ([`CHAIN_MIN`]): per stream, their one-stream states.
    chains: Vec<Chain>,
    /// The convolutions' scratch of the chains run on a pool, one per place in a call, so that
    /// whichever thread runs a chain finds its scratch grown (see [`each_chain`]).
    workspaces: Vec<Workspace>,
    chain: Range<usize>,
    tr: TransformerState,
    quant: QuantScratch,
    codes: Vec<u32>,
}

impl SideState {
    /// Fresh states of `streams` streams of `side` of `m` for calls of at most `chunk` frames.
    /// `exact_window`: as [`Transformer::state`](super::transformer::Transformer::state).
    pub fn new(m: &Mimi, side: Side, chunk: usize, exact_window: bool, streams: usize) -> Self {
        let steps = m.plan.side(side);
        let flows = m
            .plan
            .flow(m, side)
            .expect("the model's plan was checked against it");
        let n = steps.len();
        let high = |i: usize| {
            let (fin, fout) = flows[i];
            matches!(
                steps[i],
                Step::Conv { .. } | Step::ConvTr { .. } | Step::Res(_)
            ) && fin.values().max(fout.values()) * chunk >= CHAIN_MIN
        };
        let (chain, joined) = match side {
            Side::Encoder => {
                let split = (0..n).find(|&i| !high(i)).unwrap_or(n);
                (0..split, split..n)
            }
            Side::Decoder => {
                let split = (0..n).rev().find(|&i| !high(i)).map_or(0, |i| i + 1);
                (split..n, 0..split)
            }
        };
        let part = |range: Range<usize>, streams| part(m, steps, &flows, range, chunk, streams);
        let io_len = match (side, chain.is_empty()) {
            (Side::Encoder, false) => flows[0].0.values() * chunk,
            _ => 0,
        };
        let chains = if chain.is_empty() {
            Vec::new()
        } else {
            (0..streams)
                .map(|_| Chain {
                    part: part(chain.clone(), 1),
                    io: vec![0.0; io_len],
                })
                .collect()
        };
        let tr_steps = steps
            .iter()
            .zip(&flows)
            .find(|(s, _)| matches!(s, Step::Layer { .. }))
            .map_or(1, |(_, (fin, _))| match fin {
                Flow::Act { steps, .. } => *steps,
                Flow::Codes => 1,
            });
        SideState {
            side,
            joined: part(joined, streams),
            chains,
            workspaces: (0..streams).map(|_| Workspace::new()).collect(),
            chain,
            tr: m
                .transformer(side)
                .state(chunk * tr_steps, exact_window, streams),
            quant: m.quant.scratch(streams * chunk),
            codes: vec![0; m.n_codebooks() * streams * chunk],
            flows,
        }
    }

    /// Encoder: `n` frames (≤ chunk) of each stream of `active` (`pcm`: stream after stream) →
    /// codes `[m, nq, n]` (borrowed).
    pub fn encode(
        &mut self,
        m: &Mimi,
        active: &[usize],
        pcm: &[f32],
        n: usize,
        pool: Option<&Pool>,
        mut trace: Trace<'_>,
    ) -> &[u32] {
        debug_assert_eq!(self.side, Side::Encoder);
        let k = active.len();
        let nq = m.n_codebooks();
        let steps = m.plan.side(self.side);
        let t0 = n * m.frame_size();
        let codes_out = &mut self.codes[..nq * k * n];
        let (tr, quant) = (Some(&mut self.tr), Some(&mut self.quant));
        let flows = &self.flows;
        let (input, t) = if self.chain.is_empty() {
            (Some(&pcm[..flows[0].0.values() * k * n]), t0)
        } else {
            // Each stream's chain from its samples to its columns of the joined activations.
            let (cin, mid) = (channels(flows[0].0), flows[self.chain.end - 1].1);
            let (c, t_mid) = (channels(mid), steps_of(mid) * n);
            let ja = SyncPtr(self.joined.s.a.as_mut_ptr());
            let chains = (&mut self.chains[..], &mut self.workspaces[..]);
            each_chain(chains, active, pool, &|ch, j, pool| {
                let ja = &ja;
                let Chain { part, io } = ch;
                gather_stream(pcm, io, (cin, k, t0, j));
                let x = Io {
                    pcm: Some(&io[..cin * t0]),
                    ..Io::default()
                };
                run_part(m, steps, flows, part, x, &[0], t0, pool, &mut None);
                // SAFETY: the joined activations hold at least [c, m·t_mid] values (the input
                // of the joined steps); stream j's columns are this task's alone.
                unsafe { scatter_stream(&part.s.a, ja.0, (c, k, t_mid, j)) };
            });
            (None, t_mid)
        };
        let io = Io {
            pcm: input,
            tr,
            quant,
            codes_out,
            ..Io::default()
        };
        let joined = &mut self.joined;
        run_part(m, steps, flows, joined, io, active, t, pool, &mut trace);
        &self.codes[..nq * k * n]
    }

    /// Decoder: codes `[m, nq, n]` of the streams `active` → `n` frames each into `out` (stream
    /// after stream).
    #[allow(clippy::too_many_arguments)]
    pub fn decode(
        &mut self,
        m: &Mimi,
        active: &[usize],
        codes: &[u32],
        n: usize,
        out: &mut [f32],
        pool: Option<&Pool>,
        mut trace: Trace<'_>,
    ) {
        debug_assert_eq!(self.side, Side::Decoder);
        let k = active.len();
        let steps = m.plan.side(self.side);
        let flows = &self.flows;
        let io = Io {
            codes_in: codes,
            tr: Some(&mut self.tr),
            quant: Some(&mut self.quant),
            ..Io::default()
        };
        let t_mid = run_part(
            m,
            steps,
            flows,
            &mut self.joined,
            io,
            active,
            n,
            pool,
            &mut trace,
        );
        let end = flows.last().map_or(Flow::Codes, |f| f.1);
        let (cout, to) = (channels(end), steps_of(end) * n);
        if self.chain.is_empty() {
            out[..cout * k * to].copy_from_slice(&self.joined.s.a[..cout * k * to]);
            return;
        }
        let c = channels(flows[self.chain.start].0);
        let ja: &[f32] = &self.joined.s.a;
        let op = SyncPtr(out.as_mut_ptr());
        let chains = (&mut self.chains[..], &mut self.workspaces[..]);
        each_chain(chains, active, pool, &|ch, j, pool| {
            let op = &op;
            let part = &mut ch.part;
            gather_stream(ja, &mut part.s.a, (c, k, t_mid, j));
            let to = run_part(
                m,
                steps,
                flows,
                part,
                Io::default(),
                &[0],
                t_mid,
                pool,
                &mut None,
            );
            // SAFETY: out holds [cout, m·to]; stream j's columns are this task's alone.
            unsafe { scatter_stream(&part.s.a, op.0, (cout, k, to, j)) };
        });
    }

    /// Stream `i` back to the fresh state.
    pub fn reset(&mut self, i: usize) {
        for s in &mut self.joined.states {
            s.reset(i);
        }
        if let Some(ch) = self.chains.get_mut(i) {
            for s in &mut ch.part.states {
                s.reset(0);
            }
        }
        self.tr.reset(i);
    }
}

fn channels(f: Flow) -> usize {
    match f {
        Flow::Act { channels, .. } => channels,
        Flow::Codes => 0,
    }
}

fn steps_of(f: Flow) -> usize {
    match f {
        Flow::Act { steps, .. } => steps,
        Flow::Codes => 1,
    }
}

/// The states and work buffers of the steps `range` of a side (`flows` per frame) for calls of
/// at most `chunk` frames of `streams` streams.
fn part(
    m: &Mimi,
    steps: &[Step],
    flows: &[(Flow, Flow)],
    range: Range<usize>,
    chunk: usize,
    streams: usize,
) -> Part {
    let mut work = ConvWork::default();
    let (mut amax, mut hmax) = (1, 1);
    let mut states = Vec::with_capacity(range.len());
    for i in range.clone() {
        let (fin, fout) = flows[i];
        let t = steps_of(fin) * chunk;
        amax = amax.max(fin.values().max(fout.values()) * chunk);
        let what = "the model's plan was checked against it";
        states.push(match steps[i] {
            Step::Conv { at, .. } => {
                let c = m.conv_at(at).expect(what);
                work.fit_conv(c, t, streams);
                StepState::Conv((0..streams).map(|_| c.state(t)).collect())
            }
            Step::ConvTr { at, .. } => {
                let c = m.conv_tr_at(at).expect(what);
                work.fit_tr(c, t, streams);
                StepState::ConvTr((0..streams).map(|_| c.state(t)).collect())
            }
            Step::Res(at) => {
                let r = m.res_at(at).expect(what);
                hmax = hmax.max(r.c1.cout * t);
                StepState::Res(r.state(t, streams, &mut work))
            }
            _ => StepState::None,
        });
    }
    Part {
        range,
        states,
        s: Scratch {
            work,
            a: vec![0.0; amax * streams],
            b: vec![0.0; amax * streams],
            h: vec![0.0; hmax * streams],
            r: vec![0.0; amax * streams],
        },
    }
}

/// Runs a part's steps for the streams `active`, `t` steps in per stream (frames for a side's
/// codes), its input `io.pcm` or else `s.a` (codes: `io.codes_in`), its output left in `s.a`
/// (codes: `io.codes_out`). Returns the steps out per stream.
#[allow(clippy::too_many_arguments)]
fn run_part(
    m: &Mimi,
    steps: &[Step],
    flows: &[(Flow, Flow)],
    part: &mut Part,
    mut io: Io<'_>,
    active: &[usize],
    mut t: usize,
    pool: Option<&Pool>,
    trace: &mut Trace<'_>,
) -> usize {
    let Part { range, states, s } = part;
    let Scratch { work, a, b, h, r } = s;
    let k = active.len();
    let what = "the model's plan was checked against it";
    for (i, st) in range.clone().zip(states.iter_mut()) {
        let step = steps[i];
        if let Some(x) = io
            .pcm
            .filter(|_| !matches!(step, Step::Conv { .. } | Step::Tap(_)))
        {
            // The side's input reaches a step that reads only its own buffer.
            a[..x.len()].copy_from_slice(x);
            io.pcm = None;
        }
        let mt = k * t;
        match (step, st) {
            (Step::Conv { at, elu }, StepState::Conv(cs)) => {
                let c = m.conv_at(at).expect(what);
                let x = match io.pcm.take() {
                    Some(x) => &x[..c.cin * mt],
                    None => &a[..c.cin * mt],
                };
                c.forward(cs, active, work, x, t, elu, b, pool);
                std::mem::swap(a, b);
                t /= c.stride;
            }
            (Step::ConvTr { at, elu }, StepState::ConvTr(cs)) => {
                let c = m.conv_tr_at(at).expect(what);
                c.forward(cs, active, work, &a[..c.cin * mt], t, elu, b, pool);
                std::mem::swap(a, b);
                t *= c.stride;
            }
            (Step::Res(at), StepState::Res(rs)) => {
                let blk = m.res_at(at).expect(what);
                blk.forward(rs, active, work, a, t, h, r, pool);
            }
            (Step::Layer { side, layer }, _) => {
                let tr = m.transformer(side);
                let Some(ts) = io.tr.as_deref_mut() else {
                    continue;
                };
                let io_len = tr.d * mt;
                let is_layer = |j: usize| matches!(steps.get(j), Some(Step::Layer { .. }));
                if i == range.start || !is_layer(i - 1) {
                    tr.enter(ts, active, &a[..io_len], t);
                }
                tr.layer(ts, layer, active, t, pool);
                if i + 1 == range.end || !is_layer(i + 1) {
                    tr.leave(ts, active, &mut a[..io_len], t);
                }
            }
            (Step::RvqEncode, _) => {
                if let Some(q) = io.quant.as_deref_mut() {
                    let codes = &mut io.codes_out[..m.n_codebooks() * mt];
                    m.quant
                        .encode(q, &a[..m.dimension() * mt], k, t, codes, pool);
                }
            }
            (Step::RvqDecode, _) => {
                if let Some(q) = io.quant.as_deref_mut() {
                    let lat = &mut a[..m.dimension() * mt];
                    m.quant.decode(q, io.codes_in, k, t, lat, pool);
                }
            }
            (Step::Tap(stage), _) => {
                let len = channels(flows[i].0) * mt;
                let x = io.pcm.unwrap_or(&a[..]);
                report(trace, stage, &x[..len]);
            }
            _ => unreachable!("a step's state is made for it"),
        }
    }
    t
}

/// Runs `f(chain, j, pool)` for every active stream `j` (its chain `chains[active[j]]`).
///
/// A state of several streams on a pool of several threads gives whole streams to the threads
/// ([`Pool::run_affine`]: a stream's chain on the same core from call to call), each chain with
/// no pool of its own, inside the workspace of its place `j` in the call. The choice depends on
/// the state and the pool only, never on how many streams are active: a call with fewer streams
/// then uses no scratch that the warm-up with all of them did not grow (one active stream of a
/// batch runs its chain on one thread). Otherwise (one stream, or no pool) the streams run one
/// after the other, each on the whole pool.
fn each_chain(
    st: (&mut [Chain], &mut [Workspace]),
    active: &[usize],
    pool: Option<&Pool>,
    f: &ChainFn<'_>,
) {
    let (chains, workspaces) = st;
    let cp = SyncPtr(chains.as_mut_ptr());
    let chain = |j: usize| {
        let cp = &cp;
        debug_assert!(active[..j].iter().all(|&a| a != active[j]));
        // SAFETY: `active` holds distinct indices into `chains`, so chain active[j] is
        // touched by the task of stream j alone.
        unsafe { &mut *cp.0.add(active[j]) }
    };
    match pool {
        Some(p) if p.n_threads() > 1 && chains.len() > 1 => {
            let wp = SyncPtr(workspaces.as_mut_ptr());
            p.run_affine(active.len(), &|j| {
                let wp = &wp;
                // SAFETY: one workspace per stream of the state, j < active.len() ≤ that
                // many, and task j alone uses workspace j.
                let ws = unsafe { &mut *wp.0.add(j) };
                ws.enter(|| f(chain(j), j, None));
            });
        }
        _ => (0..active.len()).for_each(|j| f(chain(j), j, pool)),
    }
}

/// Copies stream `j`'s columns of `joined` (`[c, m·t]`, its `t` columns at `j·t`) into `dst`
/// (`[c, t]`).
fn gather_stream(joined: &[f32], dst: &mut [f32], (c, m, t, j): (usize, usize, usize, usize)) {
    for (ch, d) in dst[..c * t].chunks_exact_mut(t).enumerate() {
        d.copy_from_slice(&joined[(ch * m + j) * t..(ch * m + j + 1) * t]);
    }
}

/// Copies `src` (`[c, t]`) into stream `j`'s columns of `joined` (`[c, m·t]`).
///
/// # Safety
/// `joined` is valid for `c·m·t` values and nobody else touches stream `j`'s columns meanwhile.
unsafe fn scatter_stream(
    src: &[f32],
    joined: *mut f32,
    (c, m, t, j): (usize, usize, usize, usize),
) {
    for (ch, s) in src[..c * t].chunks_exact(t).enumerate() {
        // SAFETY: row ch's stream-j span, inside the caller's bound.
        let d = unsafe { std::slice::from_raw_parts_mut(joined.add((ch * m + j) * t), t) };
        d.copy_from_slice(s);
    }
}
