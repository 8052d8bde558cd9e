//! The full-duplex runtime: engine, sessions and the frame pass.
