//! The speech-to-text service a server holds in its shared state: the batched driver, the tokenizer and
//! the admission slots that the `/api/asr-streaming` handler ([`crate::asr`]) works with.

use std::sync::Arc;

use model::stt::SttPlan;
use model::text::SentencePiece;
use runtime::SttRunner;
use tokio::sync::Semaphore;

/// The speech-to-text service of a server: the batched driver, its tokenizer and admission slots.
pub struct AsrService {
    pub(crate) runner: SttRunner,
    pub(crate) spm: SentencePiece,
    pub(crate) plan: SttPlan,
    pub(crate) slots: Arc<Semaphore>,
    /// The model in words (for logs and `/api/info`).
    pub description: String,
}

impl AsrService {
    /// A service over a started runner (its slots are the streams admitted at once) and the model's
    /// tokenizer.
    pub fn new(runner: SttRunner, spm: SentencePiece, description: String) -> AsrService {
        let plan = runner.model().plan();
        let slots = Arc::new(Semaphore::new(runner.slots()));
        AsrService {
            runner,
            spm,
            plan,
            slots,
            description,
        }
    }

    /// Streams admitted at once.
    pub fn max_streams(&self) -> usize {
        self.runner.slots()
    }

    /// Slots free now.
    pub fn free_streams(&self) -> usize {
        self.slots.available_permits()
    }

    /// Stops the driver (the streams' queues end).
    pub fn stop(&self) {
        let _ = self.runner.stop();
    }
}
