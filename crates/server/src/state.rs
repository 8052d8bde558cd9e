//! What every request handler shares: the backend, the counters, admission slots and shutdown.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{watch, Semaphore};

use crate::backend::Backend;
use crate::metrics::Metrics;

/// Shared state of the HTTP application.
pub(crate) struct AppState {
    pub backend: Arc<dyn Backend>,
    pub metrics: Arc<Metrics>,
    pub slots: Arc<Semaphore>,
    pub max_queue: usize,
    pub shutdown: watch::Receiver<bool>,
    /// One clone per open WebSocket connection (to wait for them at shutdown).
    pub tracker: Arc<()>,
    pub static_dir: Option<PathBuf>,
    /// Secret required on `/api/chat` (`None` = open).
    pub auth_token: Option<String>,
    /// A session whose client sends no audio for this long is closed (`None` = never).
    pub idle_timeout: Option<std::time::Duration>,
    /// The speech-to-text service (`/api/asr-streaming`), if this server runs one.
    pub asr: Option<Arc<crate::asr_service::AsrService>>,
    /// Whether `/api/chat` is served (false when only a speech-to-text model runs).
    pub chat: bool,
}
