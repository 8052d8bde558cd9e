//! Every WGSL module of the backend translated by naga to MSL (Metal) and HLSL (DX12), so a shader
//! that only those compilers would reject fails here, on a machine with neither.

use gpu::shaders::Module;
use gpu::MimiKernel;

/// Every module of the backend: the LM's and Mimi's, each with a name for the messages.
fn all_modules() -> Vec<(String, String)> {
    let lm = Module::all()
        .into_iter()
        .map(|m| (format!("{m:?}"), m.source()));
    let mimi = MimiKernel::ALL
        .iter()
        .map(|k| (format!("Mimi {k:?}"), k.source()));
    lm.chain(mimi).collect()
}

fn parse(m: &str, src: &str) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{m}: WGSL parse error:\n{}", e.emit_to_string(src)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{m}: validation error:\n{}", e.emit_to_string(src)));
    (module, info)
}

#[test]
fn every_module_translates_to_msl() {
    for (m, src) in all_modules() {
        let (module, info) = parse(&m, &src);
        let (msl, tr) = naga::back::msl::write_string(
            &module,
            &info,
            &naga::back::msl::Options::default(),
            &naga::back::msl::PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{m}: MSL: {e}"));
        for ep in &tr.entry_point_names {
            assert!(ep.is_ok(), "{m}: MSL entry point: {ep:?}");
        }
        assert!(msl.contains("kernel"), "{m}: no MSL kernel");
    }
}

#[test]
fn every_module_translates_to_hlsl() {
    for (m, src) in all_modules() {
        let (module, info) = parse(&m, &src);
        let mut out = String::new();
        let opts = naga::back::hlsl::Options::default();
        let popts = naga::back::hlsl::PipelineOptions::default();
        naga::back::hlsl::Writer::new(&mut out, &opts, &popts)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{m}: HLSL: {e}"));
        assert!(out.contains("[numthreads("), "{m}: no HLSL entry point");
    }
}

/// The check catches a shader error: a module with an undeclared identifier is refused.
#[test]
fn a_broken_module_is_refused() {
    let src = Module::Gate
        .source()
        .replace("M.hidden + j]", "M.hiddn + j]");
    assert!(naga::front::wgsl::parse_str(&src).is_err());
}
