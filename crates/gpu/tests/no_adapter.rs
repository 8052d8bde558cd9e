//! With no Vulkan driver visible, asking for the GPU is a typed `NoAdapter` error with a hint, and
//! `auto` finds no GPU (the caller then uses the CPU). Its own test binary: it changes the
//! process environment before any instance exists.

use gpu::{AdapterChoice, GpuContext, GpuError, GpuOptions};

#[test]
fn no_driver_gives_no_adapter_error() {
    // The Vulkan loader reads these when an instance is created.
    std::env::set_var("VK_ICD_FILENAMES", "/nonexistent/none.json");
    std::env::set_var("VK_DRIVER_FILES", "/nonexistent/none.json");
    let list = gpu::adapters();
    assert!(list.iter().all(|a| a.backend != "Vulkan"), "{list:?}");
    let e = GpuContext::new(AdapterChoice::Gpu(None), GpuOptions::default()).unwrap_err();
    assert!(matches!(e, GpuError::NoAdapter { .. }), "{e:?}");
    assert!(e.to_string().contains("hint"), "{e}");
    assert_eq!(
        gpu::choose_adapter(&list, AdapterChoice::Auto).unwrap(),
        None
    );
}
