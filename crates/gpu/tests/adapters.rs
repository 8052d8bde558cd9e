//! Adapter choice (no device needed) and the typed refusals.

mod common;

use gpu::{choose_adapter, AdapterChoice, AdapterDesc, GpuError, GpuOptions};
use kernels::{Matrix, WeightFormat};

fn desc(index: usize, t: wgpu::DeviceType) -> AdapterDesc {
    AdapterDesc {
        index,
        name: format!("adapter {index}"),
        backend: "Vulkan".into(),
        device_type: t,
        driver: String::new(),
    }
}

#[test]
fn auto_takes_hardware_gpus_only() {
    use wgpu::DeviceType::*;
    let lavapipe_only = [desc(0, Cpu)];
    assert_eq!(
        choose_adapter(&lavapipe_only, AdapterChoice::Auto).unwrap(),
        None
    );
    assert_eq!(
        choose_adapter(&lavapipe_only, AdapterChoice::Gpu(None)).unwrap(),
        Some(0)
    );
    let mixed = [desc(0, Cpu), desc(1, IntegratedGpu), desc(2, DiscreteGpu)];
    assert_eq!(
        choose_adapter(&mixed, AdapterChoice::Auto).unwrap(),
        Some(2)
    );
    assert_eq!(
        choose_adapter(&mixed, AdapterChoice::Gpu(None)).unwrap(),
        Some(2)
    );
    assert_eq!(
        choose_adapter(&mixed, AdapterChoice::Gpu(Some(0))).unwrap(),
        Some(0)
    );
    let igpu = [desc(0, Cpu), desc(1, IntegratedGpu)];
    assert_eq!(choose_adapter(&igpu, AdapterChoice::Auto).unwrap(), Some(1));
    assert_eq!(
        choose_adapter(&[desc(0, VirtualGpu)], AdapterChoice::Auto).unwrap(),
        None
    );
    assert!(matches!(
        choose_adapter(&mixed, AdapterChoice::Gpu(Some(3))),
        Err(GpuError::NoAdapter { .. })
    ));
    assert!(matches!(
        choose_adapter(&[], AdapterChoice::Gpu(None)),
        Err(GpuError::NoAdapter { .. })
    ));
    assert_eq!(choose_adapter(&[], AdapterChoice::Auto).unwrap(), None);
}

#[test]
fn refusals_are_typed_with_hints() {
    let Some(ctx) = common::context_with(GpuOptions {
        max_binding_bytes: Some(64),
        memory_budget: Some(4096),
        ..Default::default()
    }) else {
        return;
    };
    // A row of 32 f32 (128 bytes) cannot be bound in 64 bytes.
    let m = Matrix::encode(WeightFormat::F32, 4, 32, &common::values(1, 128)).unwrap();
    let e = gpu::GpuMatrix::upload(&ctx, "w", &m).unwrap_err();
    match &e {
        GpuError::DoesNotFit {
            needed, available, ..
        } => assert_eq!((*needed, *available), (128, 64)),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("hint"), "{e}");
    // Over the memory budget.
    let m = Matrix::encode(WeightFormat::F32, 256, 16, &common::values(1, 4096)).unwrap();
    let e = ctx.matmul_once(&m, &[0.0; 16], 1).unwrap_err();
    assert!(
        matches!(
            e,
            GpuError::DoesNotFit {
                available: 4096,
                ..
            }
        ),
        "{e:?}"
    );
    // Columns the kernels cannot read.
    let m = Matrix::encode(WeightFormat::F32, 2, 3, &[0.0; 6]).unwrap();
    let e = gpu::GpuMatrix::upload(&ctx, "w", &m).unwrap_err();
    assert!(matches!(e, GpuError::Unsupported { .. }), "{e:?}");
    assert!(e.to_string().contains("hint"), "{e}");
}
