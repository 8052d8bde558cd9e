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
        let reflection = naga::back::hlsl::Writer::new(&mut out, &opts, &popts)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{m}: HLSL: {e}"));
        // Every entry point of the module was written, under the name the reflection gives, with
        // its workgroup size (not merely some `[numthreads(` somewhere in the text).
        assert!(!module.entry_points.is_empty(), "{m}: no entry point");
        assert_eq!(
            reflection.entry_point_names.len(),
            module.entry_points.len(),
            "{m}: HLSL entry points"
        );
        for (ep, name) in module
            .entry_points
            .iter()
            .zip(&reflection.entry_point_names)
        {
            let name = name
                .as_ref()
                .unwrap_or_else(|e| panic!("{m}: HLSL entry point {}: {e:?}", ep.name));
            let [x, y, z] = ep.workgroup_size;
            let def = out
                .find(&format!("void {name}("))
                .unwrap_or_else(|| panic!("{m}: entry point {} ({name}) not written", ep.name));
            // The last `[numthreads(` before the definition is this entry point's attribute.
            let attr = out[..def].rfind("[numthreads(").map(|a| &out[a..def]);
            let head = format!("[numthreads({x}, {y}, {z})]");
            assert!(
                attr.is_some_and(|a| a.trim_end() == head),
                "{m}: entry point {} ({name}): attribute {attr:?}, want {head}",
                ep.name
            );
        }
    }
}

/// The check catches a shader error: a module with an undeclared identifier is refused.
#[test]
fn a_broken_module_is_refused() {
    let src = Module::RmsNorm
        .source()
        .replace("f32(M.d) + M.eps", "f32(M.d) + M.epz");
    assert!(naga::front::wgsl::parse_str(&src).is_err());
}
