// cube: the Lua that mlua builds, patched at build time.
//
// `lua-5.4.9-upstream/` holds Lua 5.4.9 exactly as lua-src 551.0.2 publishes
// it; `patches/` holds cube's changes as unified diffs (CUBE-PATCH.md says
// what each does and why). This script copies the upstream tree, applies
// every patch in order, and writes the result to `lua-5.4.9/` (ignored by
// git), which is where lua-src's unchanged `src/lib.rs` reads the sources
// from when mlua-sys's build script compiles them. A patch that no longer
// applies fails the build, naming the patch and the file: an upgrade cannot
// silently drop a change.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const UPSTREAM_DIR: &str = "lua-5.4.9-upstream";
const PATCHED_DIR: &str = "lua-5.4.9";
const PATCHES: [&str; 13] = [
    "patches/01-string-order-linear.patch",
    // Work inside one call or instruction paid for, no to-be-closed
    // values, no heap addresses (CUBE-PATCH.md; one patch per file).
    "patches/03-budget-lua.h.patch",
    "patches/04-budget-ldebug.c.patch",
    "patches/05-budget-lstate.h.patch",
    "patches/06-budget-lstate.c.patch",
    "patches/07-budget-lvm.c.patch",
    "patches/08-budget-ldo.c.patch",
    "patches/09-budget-ltm.c.patch",
    "patches/10-budget-lobject.c.patch",
    "patches/11-budget-lbaselib.c.patch",
    "patches/12-budget-lauxlib.c.patch",
    "patches/13-budget-lstrlib.c.patch",
    "patches/14-budget-lutf8lib.c.patch",
];

fn main() {
    let root = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed={UPSTREAM_DIR}");
    println!("cargo:rerun-if-changed=patches");
    // Rerun when the generated tree is edited or deleted; it is rewritten
    // only where it differs, so an unchanged build does not loop.
    println!("cargo:rerun-if-changed={PATCHED_DIR}");

    let mut files = read_tree(&root.join(UPSTREAM_DIR));
    for patch_path in PATCHES {
        let text = fs::read_to_string(root.join(patch_path))
            .unwrap_or_else(|e| panic!("cannot read {patch_path}: {e}"));
        let patch = diffy::Patch::from_str(&text)
            .unwrap_or_else(|e| panic!("{patch_path} is not a unified diff: {e}"));
        let target = patch
            .modified()
            .expect("a patch names the file it changes")
            .trim_start_matches("b/")
            .to_owned();
        let base = files
            .iter_mut()
            .find(|(name, _)| *name == target)
            .unwrap_or_else(|| panic!("{patch_path} changes {target}, which upstream does not have"));
        let source = String::from_utf8(base.1.clone())
            .unwrap_or_else(|_| panic!("{target} is not UTF-8"));
        let patched = diffy::apply(&source, &patch).unwrap_or_else(|e| {
            panic!(
                "{patch_path} no longer applies to {UPSTREAM_DIR}/{target} ({e}): \
                 redo the change by hand and regenerate the patch (CUBE-PATCH.md, 'Updating')"
            )
        });
        base.1 = patched.into_bytes();
    }
    write_tree(&root.join(PATCHED_DIR), &files);
}

/// Every file under `dir`, as (path relative to `dir`, contents), sorted.
fn read_tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in fs::read_dir(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("under dir");
                let contents = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.push((relative.to_string_lossy().into_owned(), contents));
            }
        }
    }
    out.sort();
    out
}

/// Makes `dir` hold exactly `files`, writing only what differs.
fn write_tree(dir: &Path, files: &[(String, Vec<u8>)]) {
    let existing = if dir.exists() { read_tree(dir) } else { Vec::new() };
    for (name, _) in &existing {
        if !files.iter().any(|(n, _)| n == name) {
            fs::remove_file(dir.join(name)).expect("remove a stale generated file");
        }
    }
    for (name, contents) in files {
        if existing.iter().any(|(n, c)| n == name && c == contents) {
            continue;
        }
        let path = dir.join(name);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create the generated tree");
        let staging = path.with_extension("cube-tmp");
        fs::write(&staging, contents).expect("write a generated file");
        fs::rename(&staging, &path).expect("put a generated file in place");
    }
}
