//! Helpers for tests that drive a [`Session`] (the `testing` feature; this crate's own tests have them too).

use crate::{FrameEvent, RuntimeError, Session, Step};

/// Pushes `pcm` into `session` and steps it until no frame is ready: every frame it produced, in order, with
/// its timings cleared (they differ from run to run), so that two runs compare with `==`.
pub fn frames_of(session: &mut Session, pcm: &[f32]) -> Result<Vec<FrameEvent>, RuntimeError> {
    session.push_pcm(pcm)?;
    let mut out = Vec::new();
    while let Step::Frame(f) = session.step()? {
        let mut f = f.clone();
        f.timings = Default::default();
        out.push(f);
    }
    Ok(out)
}
