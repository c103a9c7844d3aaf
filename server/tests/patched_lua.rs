//! The Lua that cell programs run on is cube's patched copy
//! (third_party/lua-src, CUBE-PATCH.md), not the crates.io one. If mlua moved
//! to a lua-src version that `[patch.crates-io]` no longer matches, Cargo
//! would only warn and link stock Lua, whose string comparison can hold the
//! writer for seconds; this test fails instead.
#![allow(clippy::unwrap_used)]

use std::path::Path;

/// The `[[package]]` block of `name` in the workspace's Cargo.lock.
fn locked_package(lock: &str, name: &str) -> String {
    lock.split("[[package]]")
        .find(|block| block.contains(&format!("name = \"{name}\"\n")))
        .unwrap_or_else(|| panic!("Cargo.lock has no package {name}"))
        .to_owned()
}

#[test]
fn mlua_links_the_patched_lua_src_from_third_party() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    let lua_src = locked_package(&lock, "lua-src");
    assert!(
        !lua_src.contains("source ="),
        "lua-src comes from a registry, not third_party/lua-src: the [patch] no longer \
         matches what mlua asks for (CUBE-PATCH.md, 'Updating')\n{lua_src}"
    );
    let manifest = std::fs::read_to_string(root.join("third_party/lua-src/Cargo.toml")).unwrap();
    let version = lua_src
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap();
    assert!(
        manifest.contains(&format!("version = {version}")),
        "{lua_src}"
    );
    assert!(
        locked_package(&lock, "mlua-sys").contains("\"lua-src\""),
        "mlua-sys no longer builds Lua from lua-src"
    );
    // The build applied cube's patches to the sources mlua-sys compiled.
    let lvm = std::fs::read_to_string(root.join("third_party/lua-src/lua-5.4.9/lvm.c")).unwrap();
    assert!(lvm.contains("memcmp(s1, s2"), "string order patch missing");
}
