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

/// A field of a uniform block: one 32-bit word as the host writes it, and the WGSL type the
/// shader reads it as (a flag is a `u32`, 0 or 1).
pub(crate) trait UniformWord: Copy {
    /// The field's WGSL type.
    const WGSL: &'static str;
    /// The field's word.
    fn word(self) -> u32;
}

impl UniformWord for u32 {
    const WGSL: &'static str = "u32";
    fn word(self) -> u32 {
        self
    }
}

impl UniformWord for i32 {
    const WGSL: &'static str = "i32";
    fn word(self) -> u32 {
        self as u32
    }
}

impl UniformWord for f32 {
    const WGSL: &'static str = "f32";
    fn word(self) -> u32 {
        self.to_bits()
    }
}

impl UniformWord for bool {
    const WGSL: &'static str = "u32";
    fn word(self) -> u32 {
        self as u32
    }
}

/// The WGSL declaration of the uniform struct `name` with `fields` (name, WGSL type) in order,
/// each one 32-bit word (so field `i` is word `i` of the block the host writes).
pub(crate) fn declare_uniform<'a>(
    name: &str,
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut out = format!("struct {name} {{\n");
    for (field, ty) in fields {
        assert!(
            matches!(ty, "u32" | "i32" | "f32"),
            "uniform field {field}: {ty} is not one word"
        );
        out.push_str(&format!("    {field}: {ty},\n"));
    }
    out.push_str("};\n");
    out
}

/// A uniform block written once by the host and read by the shaders, declared once for both: the
/// Rust struct (with `Default`), its `bytes()` (one little-endian word per field in order,
/// zero-padded to a multiple of 16 bytes, the size WGSL gives a uniform struct) and its `wgsl()`
/// struct declaration ([`declare_uniform`]), so the two sides cannot disagree on the layout.
macro_rules! uniform_block {
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($(#[$fm:meta])* $fvis:vis $field:ident: $ty:ty,)*
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default)]
        $vis struct $name {
            $($(#[$fm])* $fvis $field: $ty,)*
        }

        impl $name {
            /// The block as the shaders read it (see `bindings::uniform_block`).
            pub(crate) fn bytes(&self) -> Vec<u8> {
                use $crate::bindings::UniformWord;
                let words = [$(self.$field.word()),*];
                let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                out.resize(out.len().div_ceil(16).max(1) * 16, 0);
                out
            }

            /// The WGSL declaration of the block (see `bindings::uniform_block`).
            pub(crate) fn wgsl() -> String {
                use $crate::bindings::UniformWord;
                $crate::bindings::declare_uniform(
                    stringify!($name),
                    [$((stringify!($field), <$ty as UniformWord>::WGSL)),*],
                )
            }
        }
    };
}
pub(crate) use uniform_block;
