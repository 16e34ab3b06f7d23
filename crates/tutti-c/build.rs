//! Gives the shared library the name it is installed under
//! (scripts/install.sh): `libtutti.so.0`, so that programs linked with
//! `-ltutti` load `libtutti.so.0` at run time.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtutti.so.0");
    println!("cargo:rerun-if-changed=build.rs");
}
