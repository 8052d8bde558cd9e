//! The committed header `include/moshi_native.h` is what cbindgen generates from the sources now.
//! Regenerate it with `MOSHI_BLESS_HEADER=1 cargo test -p moshi-capi --test header`.

use std::path::PathBuf;

#[test]
fn committed_header_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut generated);
    let path = dir.join("include/moshi_native.h");
    if std::env::var_os("MOSHI_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale; regenerate it with MOSHI_BLESS_HEADER=1 cargo test -p moshi-capi --test header",
        path.display()
    );
}
