//! Rebuild the floors object when `bpf-linker` changes: it is the linker, and cargo
//! does not otherwise know about it.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => println!("cargo:warning=bpf-linker not found ({e}); run `cargo xtask setup`"),
    }
}
