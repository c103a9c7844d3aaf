// cube: the Lua sources are compiled by the build script of the crate that
// uses this one (mlua-sys), which Cargo reruns only when this crate
// changes; without this, an edit to a patched C file (CUBE-PATCH.md) was
// not rebuilt by an incremental build.
fn main() {
    println!("cargo:rerun-if-changed=lua-5.4.9");
}
