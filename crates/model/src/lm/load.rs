//! Building the LM's matrices on several threads. Repacking a quantized checkpoint is the bulk of the
//! load (every weight byte is read from the mapping and written into the kernels' tile layout, and each
//! fresh page of the copy is faulted in and zeroed by the OS), and the matrices are independent, so
//! they are built over the caller's [`Pool`] (this crate creates no thread).
//!
//! [`LmModel::from_source`] stays the one description of which tensor goes where. It runs twice: once
//! over a [`Recorder`] that only notes the matrices it asks for (in order, answering with placeholders),
//! then, after those matrices were built in parallel, over a [`Replay`] that hands them back in the same
//! order. Errors come out exactly as from a sequential load: the first failing request in order.
//!
//! What bounds the load from a warm page cache is the copy itself: a `perf` profile of a q8_0 load
//! (`BENCHMARKS.md`, issue 18) spent half its samples in the kernel zeroing the fresh anonymous pages of
//! the 8.7 GB repacked copy and a fifth in the repack shuffle. Huge pages are already advised before
//! the first write (one fault per 2 MiB), so populating the destination ahead (`MAP_POPULATE`) would
//! zero the same bytes. Using tensors in place from the mapping is not open to the matrices (the kernels
//! read the tile layout, not GGUF's row blocks); what is left in row layout (embedding tables) is a few
//! per cent of the bytes. Only a repacked image kept on disk and mapped would skip both the zeroing and
//! the shuffle; it is not built: it costs a second copy of the model on disk and in the page cache next
//! to the checkpoint, and a file mapping streams from 4 KiB pages (q8_0 frames ~13 % slower than from
//! the huge pages of the copy).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use kernels::{Matrix, Pool};

use super::source::TensorSource;
use super::spec::LmSpec;
use super::table::MatrixRef;
use super::{LmError, LmModel};

/// One matrix [`LmModel::from_source`] asks for: an entry of the weight table.
type Request = MatrixRef;

/// A source that answers every matrix call through one [`Request`]: the two passes of
/// [`LmModel::from_source_on`] differ only in what they do with it.
trait ByRequest {
    fn serve(&self, req: Request) -> Result<Matrix, LmError>;
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError>;
}

impl<T: ByRequest> TensorSource for T {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, LmError> {
        self.serve(MatrixRef {
            name: name.to_string(),
            shape: [rows, cols],
            take: None,
            gated: false,
        })
    }

    fn matrix_rows(
        &self,
        name: &str,
        shape: [usize; 2],
        take: std::ops::Range<usize>,
    ) -> Result<Matrix, LmError> {
        self.serve(MatrixRef {
            name: name.to_string(),
            shape,
            take: Some(take),
            gated: false,
        })
    }

    fn load(&self, m: &MatrixRef) -> Result<Matrix, LmError> {
        self.serve(m.clone())
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError> {
        ByRequest::vector(self, name, len)
    }
}

/// Notes every matrix request and answers it with a 1×1 placeholder; vectors are zeros of the asked
/// length (the recording pass reads nothing).
#[derive(Default)]
struct Recorder {
    requests: std::cell::RefCell<Vec<Request>>,
}

impl ByRequest for Recorder {
    fn serve(&self, req: Request) -> Result<Matrix, LmError> {
        self.requests.borrow_mut().push(req);
        Ok(Matrix::from_f32(1, 1, vec![0.0]).expect("a 1x1 matrix is valid"))
    }

    fn vector(&self, _name: &str, len: usize) -> Result<Vec<f32>, LmError> {
        Ok(vec![0.0; len])
    }
}

/// Hands back the prebuilt matrices in request order; anything asked out of that order (it cannot
/// happen while `from_source` is deterministic) is built from the source directly.
struct Replay<'a, S: ?Sized> {
    src: &'a S,
    requests: Vec<Request>,
    built: Vec<Mutex<Option<Result<Matrix, LmError>>>>,
    next: Cell<usize>,
}

impl<S: TensorSource + ?Sized> ByRequest for Replay<'_, S> {
    fn serve(&self, req: Request) -> Result<Matrix, LmError> {
        let i = self.next.get();
        if self.requests.get(i) == Some(&req) {
            self.next.set(i + 1);
            let slot = self.built[i]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(r) = slot {
                return r;
            }
        }
        self.src.load(&req)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError> {
        self.src.vector(name, len)
    }
}

impl LmModel {
    /// [`LmModel::from_source`] with the matrices built (read, converted, repacked) on all threads of
    /// `pool`, each thread taking the next unbuilt matrix in load order. The result is the same model,
    /// bit for bit, and the same error as a sequential load.
    pub fn from_source_on<S: TensorSource + Sync + ?Sized>(
        src: &S,
        spec: LmSpec,
        pool: &Pool,
    ) -> Result<Self, LmError> {
        if pool.n_threads() <= 1 {
            return Self::from_source(src, spec);
        }
        let recorder = Recorder::default();
        LmModel::from_source(&recorder, spec.clone())?;
        let requests = recorder.requests.into_inner();
        let built: Vec<Mutex<Option<Result<Matrix, LmError>>>> =
            requests.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        pool.run(pool.n_threads(), &|_| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            // After a failure the load stops early: the replay builds what is left (up to the error)
            // itself, so the error returned is still the first in order.
            if i >= requests.len() || failed.load(Ordering::Relaxed) {
                return;
            }
            let r = src.load(&requests[i]);
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            *built[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        });
        LmModel::from_source(
            &Replay {
                src,
                requests,
                built,
                next: Cell::new(0),
            },
            spec,
        )
    }
}

impl LmModel {
    /// [`LmModel::load`] with the matrices built on all threads of `pool` (see
    /// [`LmModel::from_source_on`]).
    pub fn load_on(
        weights: &crate::checkpoint::Weights,
        cfg: &crate::checkpoint::LmConfig,
        pool: &Pool,
    ) -> Result<Self, LmError> {
        Self::from_source_on(weights, LmSpec::from_config(cfg)?, pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Bundle, Weights};
    use crate::lm::tests::fixture_dir;
    use crate::lm::{KvDtype, LmGen};
    use crate::sampling::{Sampler, SamplerConfig};

    fn bundle(dir: &str) -> (Weights, crate::checkpoint::LmConfig) {
        let b = Bundle::open(&fixture_dir().join("..").join(dir)).unwrap();
        (b.lm_weights().unwrap(), b.config.lm.clone())
    }

    /// Text and Depformer logits of a few greedy frames, as bits.
    fn logits_bits(model: &LmModel) -> Vec<u32> {
        let pool = Pool::new(1);
        let spec = model.spec();
        let mut s = Sampler::new(SamplerConfig::greedy(), spec.text_card, spec.card).unwrap();
        let mut g = LmGen::new(model, KvDtype::F32).unwrap();
        let mut bits = Vec::new();
        for t in 0..4u32 {
            let user: Vec<u32> = (0..spec.n_user() as u32)
                .map(|i| (7 * t + i) % 64)
                .collect();
            g.step(model, &user, &mut s, &pool).unwrap();
            let st = g.state();
            bits.extend(st.text_logits().iter().map(|x| x.to_bits()));
            bits.extend(st.depformer_logits().iter().map(|x| x.to_bits()));
        }
        bits
    }

    /// Built on 3 threads, every matrix is the one a sequential load builds: f32 borrowed from the
    /// mapping, Q8_0 repacked, MLX 4-bit repacked (the runs agree bit for bit).
    #[test]
    fn parallel_load_is_the_sequential_load() {
        let pool = Pool::new(3);
        for dir in ["lm", "lm_gguf_q8", "lm_mlx_q4"] {
            let (w, cfg) = bundle(dir);
            let seq = LmModel::load(&w, &cfg).unwrap();
            let par = LmModel::load_on(&w, &cfg, &pool).unwrap();
            assert_eq!(
                seq.streamed_weight_bytes(),
                par.streamed_weight_bytes(),
                "{dir}"
            );
            assert_eq!(logits_bits(&seq), logits_bits(&par), "{dir}");
        }
    }

    /// Every matrix of the weight table read from a checkpoint in its own layout (no CPU matrix
    /// built) is the CPU matrix of the same tensor un-packed: the bytes a device uploads from the
    /// checkpoint are the ones it uploaded through the CPU model, for every fixture format.
    #[test]
    fn checkpoint_parts_are_the_unpacked_cpu_matrices() {
        let dirs = [
            "lm",
            "lm_gguf_q8",
            "lm_mlx_q4",
            "lm_mlx_q8",
            "lm_mlx_bf16",
            "lm_candle_bf16",
            "tools/ggufpy_q4_0",
            "tools/candle_q8_0",
        ];
        for dir in dirs {
            let (w, cfg) = bundle(dir);
            let table = crate::lm::LmTensors::table(&LmSpec::from_config(&cfg).unwrap());
            let mats = table.matrices();
            assert!(mats.len() > 20, "{dir}: {} matrices", mats.len());
            for m in mats {
                let cpu = w.load(m).unwrap();
                let parts = TensorSource::checkpoint_parts(&w, m).unwrap();
                // Not `assert_eq!`: a failure would print every byte.
                let same = parts == (cpu.format(), cpu.checkpoint_parts());
                assert!(same, "{dir}: {m:?} differs from the CPU matrix's parts");
            }
        }
    }

    /// A source failing on two tensors: a parallel load reports the one a sequential load meets
    /// first, whichever failed first in time. The earlier one takes 200 ms to fail, so the other
    /// workers usually reach and fail the later one before it (a load that returned the error it saw
    /// first in time would then report the later tensor).
    #[test]
    fn parallel_load_reports_the_first_error_in_load_order() {
        struct Failing<'a>(&'a Weights, [&'static str; 2]);
        // Through `ByRequest`, as the load's own passes: one place sees every matrix request.
        impl ByRequest for Failing<'_> {
            fn serve(&self, req: Request) -> Result<Matrix, LmError> {
                if req.name == self.1[0] {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                if self.1.contains(&req.name.as_str()) {
                    return Err(LmError::Config(format!("refused {}", req.name)));
                }
                self.0.load(&req)
            }
            fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError> {
                TensorSource::vector(self.0, name, len)
            }
        }
        let (w, cfg) = bundle("lm_gguf_q8");
        let spec = LmSpec::from_config(&cfg).unwrap();
        let pool = Pool::new(3);
        let src = Failing(
            &w,
            [
                "transformer.layers.1.gating.linear_in.weight",
                "linears.0.weight",
            ],
        );
        let seq = LmModel::from_source(&src, spec.clone())
            .unwrap_err()
            .to_string();
        assert!(seq.contains("transformer.layers.1"), "{seq}");
        for _ in 0..3 {
            let par = LmModel::from_source_on(&src, spec.clone(), &pool)
                .unwrap_err()
                .to_string();
            assert_eq!(par, seq);
        }
    }
}
