//! The WGSL side of a kernel's bindings: how each buffer is bound, and the declarations a shader
//! gets from that list. A leaf module, so that the context (which makes bind group layouts from the
//! list) and the shader sources (which declare the bindings from it) both read it without reading
//! each other.

/// How a kernel binds a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Access {
    Uniform,
    Read,
    Write,
}

/// The WGSL declarations of a kernel's bindings, written from the list its bind group layout is
/// made from (`GpuContext::layout`) so that the shader cannot declare a binding otherwise than
/// it is bound: binding 0 (`access[0]`, a uniform) is the block `uniform` (`"name: Struct"`),
/// binding `i ≥ 1` the `i`-th of `buffers` (`"name: element type"`, comma separated), an array
/// read-only or read-write as `access[i]` says. Runs when a pipeline is built, never per frame.
pub(crate) fn declare_bindings(access: &[Access], uniform: &str, buffers: &str) -> String {
    let all: Vec<&str> = std::iter::once(uniform)
        .chain(buffers.split(','))
        .map(str::trim)
        .collect();
    assert_eq!(all.len(), access.len(), "one name per binding: {all:?}");
    let mut out = String::new();
    for (i, (a, b)) in access.iter().zip(all).enumerate() {
        let (name, ty) = b
            .split_once(':')
            .map(|(n, t)| (n.trim(), t.trim()))
            .unwrap_or_else(|| panic!("binding {i} is not `name: type`: {b:?}"));
        let var = match a {
            Access::Uniform => format!("var<uniform> {name}: {ty}"),
            Access::Read => format!("var<storage, read> {name}: array<{ty}>"),
            Access::Write => format!("var<storage, read_write> {name}: array<{ty}>"),
        };
        out.push_str(&format!("@group(0) @binding({i}) {var};\n"));
    }
    out
}
