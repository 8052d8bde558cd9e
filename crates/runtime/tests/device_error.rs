//! A device's error reaches the runtime's caller with its type: opening a GPU that does not exist is
//! `RuntimeError::Device` holding the `gpu::GpuError` itself, and a GPU failure inside the LM or the codec
//! is `RuntimeError::Lm` / `RuntimeError::Codec` holding it (the frame pass's own path, with an injected
//! fault, is `session.rs`'s `a_device_error_reaches_the_caller_typed`). Runs on any machine: no machine has
//! adapter 4095.
#![cfg(feature = "gpu")]

use std::path::Path;

use gpu::GpuError;
use model::lm::LmError;
use model::mimi::MimiError;
use runtime::{Device, Engine, EngineOptions, RuntimeError};

#[test]
fn a_missing_adapter_is_a_device_error_holding_the_gpu_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    let opts = EngineOptions {
        device: Device::Gpu {
            adapter: Some(4095),
            threads: 1,
        },
        ..Default::default()
    };
    let err = match Engine::open(&dir, opts) {
        Ok(_) => panic!("adapter 4095 opened"),
        Err(e) => e,
    };
    let RuntimeError::Device(source) = &err else {
        panic!("expected a device error, got {err:?}");
    };
    assert!(
        matches!(
            source.downcast_ref::<GpuError>(),
            Some(GpuError::NoAdapter { .. })
        ),
        "{source:?}"
    );
    // The same error is the runtime error's `source()`, for callers that walk the chain.
    let chained = std::error::Error::source(&err).expect("a source");
    assert!(chained.downcast_ref::<GpuError>().is_some(), "{chained:?}");
}

#[test]
fn a_gpu_failure_inside_the_lm_or_the_codec_keeps_its_type() {
    let lost = || GpuError::Runtime("device lost (injected)".into());
    let e = RuntimeError::from(LmError::from(lost()));
    assert!(
        matches!(&e, RuntimeError::Lm(LmError::Backend(b))
            if matches!(b.downcast_ref::<GpuError>(), Some(GpuError::Runtime(_)))),
        "{e:?}"
    );
    let e = RuntimeError::from(MimiError::from(lost()));
    assert!(
        matches!(&e, RuntimeError::Codec(MimiError::Backend(b))
            if matches!(b.downcast_ref::<GpuError>(), Some(GpuError::Runtime(_)))),
        "{e:?}"
    );
    // The message is the GPU's, unchanged.
    assert_eq!(e.to_string(), lost().to_string());
}
