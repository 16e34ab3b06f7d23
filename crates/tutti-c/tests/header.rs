//! `include/tutti.h` is generated from the Rust source by cbindgen: this
//! test regenerates it and fails if the checked-in copy differs. Run with
//! `TUTTI_BLESS=1` to write the new header.

use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    let generated = String::from_utf8(out).expect("UTF-8");
    let path = dir.join("include/tutti.h");
    #[allow(clippy::disallowed_methods)] // a test's own switch
    if std::env::var_os("TUTTI_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/tutti.h");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == generated,
        "include/tutti.h is stale: regenerate it with \
         `TUTTI_BLESS=1 cargo test --release -p tutti-c --test header`"
    );
}
