//! Guards namespace access control and hard partitioning end to end, with a real `cubed` (run as root) and `cubec` spawned under other uids: a namespace without a grant is indistinguishable from a missing one for every command (byte-identical errors, not in `ns list`, not in `stats`), read-only grants read but never write, read-write grants write, revoke hides again, owners and grants survive checkpoint, restart and `kill -9` but not a drop, a user owns and administers what it creates, `default` is the administrators', checkpoint/backup are admin-only, `--allow-uid`/`--allow-gid` and the default socket mode 0600 refuse at connect, and nothing (reads, writes, edges, walks, scans, programs, drops) crosses from one namespace to another.
//!
//! Needs root (to spawn `cubec` as another uid); elsewhere all but the partitioning test skip
//! with a note. `cubec` is
//! looked for beside `cubed` (`$CUBEC_BIN` overrides): `cargo test -p cube-server` does not
//! build it, `cargo build -p cube-client --bin cubec` (or `make test`) does.
#![allow(clippy::unwrap_used)]

mod common;
use common::{cannot_switch_uids, reachable_by_others, runnable_by_others};

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use cube_client::{
    CellBox, Client, ClientError, Coord, Direction, ErrorCode, LocalDaemon, NamespaceName,
    NamespaceSpec, ProgramValue, Request, Response, StatsValue, WalkOptions,
};
use tempfile::TempDir;

/// The second user (`nobody` on most systems).
const OTHER: u32 = 65534;
/// A third, unrelated user.
const THIRD: u32 = 65533;

/// `true` (after a note) when the test cannot switch uids and must skip.
fn c(x: i32, y: i32, z: i32) -> Coord {
    Coord::new(x, y, z)
}

fn name(ns: &str) -> NamespaceName {
    NamespaceName::new(ns).unwrap()
}

fn everywhere() -> CellBox {
    CellBox::new(
        c(i32::MIN, i32::MIN, i32::MIN),
        c(i32::MAX, i32::MAX, i32::MAX),
    )
    .unwrap()
}

/// Whether every directory from `/` down to `path` lets others through.
/// `cubec`: `$CUBEC_BIN`, else beside `cubed` (found like `LocalDaemon` finds it).
fn cubec_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CUBEC_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let cubed = LocalDaemon::find_binary().unwrap();
    let cubec = cubed.with_file_name("cubec");
    assert!(
        cubec.is_file(),
        "no cubec beside {}; build it with `cargo build -p cube-client --bin cubec` \
         (or set $CUBEC_BIN)",
        cubed.display()
    );
    cubec
}

/// A daemon (run as this process's uid, root) whose socket directory and
/// `cubec` other uids can reach.
struct Tenancy {
    // Dropped first: the daemon is killed before its directory goes.
    daemon: LocalDaemon,
    cubec: PathBuf,
    dir: TempDir,
}

impl Tenancy {
    fn start(extra_args: &[&str]) -> Tenancy {
        let mut base = std::env::temp_dir();
        if !reachable_by_others(&base) {
            base = PathBuf::from("/tmp");
        }
        let dir = tempfile::Builder::new()
            .prefix("cube-acl-")
            .tempdir_in(&base)
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            reachable_by_others(dir.path()),
            "{} is not reachable by other uids",
            dir.path().display()
        );
        let cubec = runnable_by_others(cubec_binary(), dir.path(), "cubec");
        let daemon = LocalDaemon::start_in(
            &dir.path().join("data"),
            &dir.path().join("cubed.sock"),
            extra_args,
        )
        .unwrap();
        Tenancy { daemon, cubec, dir }
    }

    /// An in-process client: this process is root, an administrator.
    fn root(&self) -> Client {
        self.daemon.client().unwrap()
    }

    /// `cubec --socket SOCKET ARGS` as `uid` (and gid `uid`).
    fn run_as(&self, uid: u32, args: &[&str]) -> Output {
        self.run_as_ids(uid, uid, args)
    }

    fn run_as_ids(&self, uid: u32, gid: u32, args: &[&str]) -> Output {
        Command::new(&self.cubec)
            .arg("--socket")
            .arg(self.daemon.socket())
            .args(args)
            .env_remove("CUBE_SOCKET")
            .current_dir("/")
            .stdin(Stdio::null())
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap()
    }

    /// Runs as `uid` what must succeed; returns stdout.
    #[track_caller]
    fn ok_as(&self, uid: u32, args: &[&str]) -> String {
        let out = self.run_as(uid, args);
        expect_exit(&out, 0, &format!("uid {uid}: {args:?}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs as `uid` what must fail with exit 3 naming `code`; returns stderr.
    #[track_caller]
    fn refused_as(&self, uid: u32, args: &[&str], code: &str) -> String {
        let out = self.run_as(uid, args);
        let err = expect_exit(&out, 3, &format!("uid {uid}: {args:?}"));
        assert!(err.contains(code), "uid {uid}: {args:?}: {err}");
        err
    }

    /// `args` with `NS` standing for the namespace, as `uid` against the
    /// hidden namespace `hidden` and against a name that does not exist:
    /// both are `no_such_namespace`, identical apart from the name.
    #[track_caller]
    fn hidden_like_missing(&self, uid: u32, hidden: &str, args: &[&str]) {
        const MISSING: &str = "nosuch";
        let with = |ns: &str| -> Vec<String> {
            args.iter()
                .map(|a| {
                    if *a == "NS" {
                        ns.to_owned()
                    } else {
                        (*a).to_owned()
                    }
                })
                .collect()
        };
        let hidden_args = with(hidden);
        let missing_args = with(MISSING);
        let hidden_out = self.run_as(uid, &as_strs(&hidden_args));
        let missing_out = self.run_as(uid, &as_strs(&missing_args));
        let what = format!("uid {uid}: {hidden_args:?}");
        let hidden_err = expect_exit(&hidden_out, 3, &what);
        expect_exit(&missing_out, 3, &format!("uid {uid}: {missing_args:?}"));
        assert!(
            hidden_err.contains("no_such_namespace")
                && hidden_err.contains(&format!("no such namespace \"{hidden}\"")),
            "{what}: {hidden_err}"
        );
        // Both names are blanked in both outputs: the hidden one may also
        // be a word of the fixed text (`default` is).
        // Timings (`in 0.01 s`) differ from run to run; they say nothing.
        let anonymised = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes)
                .replace(hidden, "<NAME>")
                .replace(MISSING, "<NAME>");
            blank_seconds(&text)
        };
        assert_eq!(
            anonymised(&hidden_out.stderr),
            anonymised(&missing_out.stderr),
            "{what}: the error reveals that {hidden:?} exists"
        );
        assert_eq!(
            anonymised(&hidden_out.stdout),
            anonymised(&missing_out.stdout),
            "{what}: stdout differs from a missing namespace's"
        );
    }

    /// `ns list` as `uid`, one name per entry.
    fn listed_for(&self, uid: u32) -> Vec<String> {
        self.ok_as(uid, &["ns", "list"])
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// `in 0.01 s` -> `in <T> s`: the only part of an answer that is timing.
fn blank_seconds(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("in ") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        let number = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number > 0 && rest[number..].starts_with(" s") {
            out.push_str("<T>");
            rest = &rest[number..];
        }
    }
    out.push_str(rest);
    out
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[track_caller]
fn expect_exit(out: &Output, code: i32, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: stdout: {}\nstderr: {err}",
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

fn create(client: &mut Client, ns: &str) {
    match client
        .call(&Request::NsCreate {
            ns: name(ns),
            spec: NamespaceSpec::default(),
        })
        .unwrap()
    {
        Response::NsCreated(info) => {
            assert_eq!(info.owner_uid, nix::unistd::getuid().as_raw(), "{info:?}");
        }
        other => panic!("ns create {ns}: {other:?}"),
    }
}

fn grant(client: &mut Client, ns: &str, uid: u32, read_only: bool) {
    match client
        .call(&Request::NsGrant {
            ns: name(ns),
            uid,
            read_only,
        })
        .unwrap()
    {
        Response::NsGranted(_) => {}
        other => panic!("ns grant {ns} {uid}: {other:?}"),
    }
}

fn revoke(client: &mut Client, ns: &str, uid: u32) {
    match client
        .call(&Request::NsRevoke { ns: name(ns), uid })
        .unwrap()
    {
        Response::NsRevoked(_) => {}
        other => panic!("ns revoke {ns} {uid}: {other:?}"),
    }
}

fn code(err: &ClientError) -> Option<ErrorCode> {
    err.server_code()
}

fn bytes(v: &str) -> ProgramValue {
    ProgramValue::Bytes(v.as_bytes().to_vec())
}

/// A namespace `secret` with a value, an edge and a program in it, as the
/// test's commands address them.
fn fill_secret(root: &mut Client, ns: &str) {
    root.put(ns, c(0, 0, 0), b"classified").unwrap();
    root.put(ns, c(1, 0, 0), b"also classified").unwrap();
    root.link(ns, c(0, 0, 0), c(1, 0, 0), "road", 1.0).unwrap();
    root.prog(ns, c(2, 0, 0), b"return cube.get(0, 0, 0)")
        .unwrap();
}

/// What `fill_secret` left is all still there, unchanged.
#[track_caller]
fn secret_intact(root: &mut Client, ns: &str) {
    assert_eq!(
        root.get(ns, c(0, 0, 0)).unwrap().as_deref(),
        Some(&b"classified"[..])
    );
    assert_eq!(root.scan_count(ns, &everywhere()).unwrap(), 2);
    let edges = root.edges(ns, c(0, 0, 0), Direction::Both, None).unwrap();
    assert_eq!(edges.len(), 1, "{edges:?}");
    assert_eq!(edges[0].other, c(1, 0, 0));
    let reply = root.run(ns, c(2, 0, 0), &[]).unwrap();
    assert_eq!(reply.value, bytes("classified"));
    let info = root.ns_info(&name(ns)).unwrap();
    assert_eq!(info.owner_uid, 0, "{info:?}");
}

/// Every command that names a namespace, with `NS` for the name. `FILE`
/// is replaced by an import file.
const EVERY_COMMAND: &[&[&str]] = &[
    &["get", "NS", "0,0,0"],
    &["--json", "get", "NS", "0,0,0"],
    &["mget", "NS", "0,0,0", "1,0,0"],
    &["put", "NS", "0,0,0", "overwritten"],
    &["put", "NS", "9,9,9", "new"],
    &["del", "NS", "0,0,0"],
    &["del", "--detach", "NS", "0,0,0"],
    &["scan", "NS", "-5,-5,-5", "5,5,5"],
    &["--json", "scan", "NS", "-5,-5,-5", "5,5,5"],
    &["link", "NS", "0,0,0", "3,0,0"],
    &["unlink", "NS", "0,0,0", "1,0,0", "--label", "road"],
    &["edges", "NS", "0,0,0"],
    &["walk", "NS", "0,0,0"],
    &["path", "NS", "0,0,0", "1,0,0"],
    &["prog", "NS", "2,0,0", "return 1"],
    &["prog", "--delete", "NS", "2,0,0"],
    &["run", "NS", "2,0,0"],
    &["stats", "NS", "2,0,0"],
    &["export", "NS"],
    &["import", "NS", "FILE"],
    &["ns", "info", "NS"],
    &["--json", "ns", "info", "NS"],
    &["ns", "drop", "NS"],
    &["ns", "grant", "NS", "--uid", "65534"],
    &["ns", "grant", "NS", "--uid", "65534", "--read-only"],
    &["ns", "revoke", "NS", "--uid", "65534"],
];

/// An import file (JSON lines, as `cubec export` writes them) other uids
/// can read.
fn import_file(t: &Tenancy) -> String {
    let path = t.dir.path().join("import.jsonl");
    fs::write(
        &path,
        "{\"type\":\"cell\",\"coord\":[0,0,0],\"value\":\"imported\"}\n\
         {\"type\":\"edge\",\"from\":[0,0,0],\"to\":[4,0,0],\"label\":\"x\",\"weight\":1.0}\n",
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    path.to_str().unwrap().to_owned()
}

fn with_file<'a>(args: &[&'a str], file: &'a str) -> Vec<&'a str> {
    args.iter()
        .map(|a| if *a == "FILE" { file } else { *a })
        .collect()
}

#[test]
fn a_namespace_without_a_grant_is_indistinguishable_from_a_missing_one() {
    if cannot_switch_uids("a_namespace_without_a_grant_is_indistinguishable_from_a_missing_one") {
        return;
    }
    let t = Tenancy::start(&["--socket-mode", "666"]);
    let mut root = t.root();
    create(&mut root, "secret");
    fill_secret(&mut root, "secret");
    create(&mut root, "visible");
    root.put("visible", c(0, 0, 0), b"for all").unwrap();
    grant(&mut root, "visible", OTHER, true);
    let file = import_file(&t);

    for args in EVERY_COMMAND {
        t.hidden_like_missing(OTHER, "secret", &with_file(args, &file));
    }

    // It lists what it may see, and only that.
    assert_eq!(t.listed_for(OTHER), ["visible"]);
    let json = t.ok_as(OTHER, &["--json", "ns", "list"]);
    assert!(
        json.contains("visible") && !json.contains("secret"),
        "{json}"
    );
    assert_eq!(t.ok_as(OTHER, &["get", "visible", "0,0,0"]), "for all");
    // Nor do the server's statistics name it.
    let stats = t.ok_as(OTHER, &["stats"]);
    assert!(!stats.contains("secret"), "{stats}");
    // Nor count it: whole-store totals are for administrators; a tenant
    // sees its own namespaces' figures.
    assert!(!stats.contains("store.cells"), "{stats}");
    // The process's memory grows with every tenant's data.
    assert!(!stats.contains("memory.resident_bytes"), "{stats}");
    assert!(stats.contains("ns.visible.cells"), "{stats}");
    // Taking the name is refused (the name space is the daemon's; this
    // does tell that the name is in use) and changes nothing: the
    // namespace keeps its owner, its data and its access list.
    t.refused_as(OTHER, &["ns", "create", "secret"], "namespace_exists");

    secret_intact(&mut root, "secret");
    assert_eq!(root.ns_info(&name("secret")).unwrap().grants, []);
    assert_eq!(root.get("secret", c(9, 9, 9)).unwrap(), None);
    assert_eq!(
        root.edges("secret", c(0, 0, 0), Direction::Out, Some("x"))
            .unwrap(),
        []
    );
    let mut listed: Vec<String> = root
        .ns_list()
        .unwrap()
        .iter()
        .map(|n| n.as_str().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, ["default", "secret", "visible"]);
}

#[test]
fn read_only_grant_reads_read_write_grant_writes_and_revoke_hides_again() {
    if cannot_switch_uids("read_only_grant_reads_read_write_grant_writes_and_revoke_hides_again") {
        return;
    }
    let t = Tenancy::start(&["--socket-mode", "666"]);
    let mut root = t.root();
    create(&mut root, "shared");
    fill_secret(&mut root, "shared");
    root.prog("shared", c(5, 0, 0), b"return cube.incr(6, 0, 0)")
        .unwrap();
    grant(&mut root, "shared", OTHER, true);
    let file = import_file(&t);

    // Reads work.
    assert_eq!(t.listed_for(OTHER), ["shared"]);
    assert_eq!(t.ok_as(OTHER, &["get", "shared", "0,0,0"]), "classified");
    let mget = t.ok_as(OTHER, &["mget", "shared", "0,0,0", "1,0,0"]);
    assert!(
        mget.contains("classified") && mget.contains("also classified"),
        "{mget}"
    );
    let scan = t.ok_as(OTHER, &["scan", "shared", "-5,-5,-5", "5,5,5"]);
    assert!(
        scan.contains("classified") && scan.contains("also classified"),
        "{scan}"
    );
    let edges = t.ok_as(OTHER, &["edges", "shared", "0,0,0"]);
    assert!(edges.contains("1,0,0") && edges.contains("road"), "{edges}");
    let walk = t.ok_as(OTHER, &["walk", "shared", "0,0,0"]);
    assert!(walk.contains("1,0,0"), "{walk}");
    t.ok_as(OTHER, &["path", "shared", "0,0,0", "1,0,0"]);
    t.ok_as(OTHER, &["stats", "shared", "2,0,0"]);
    let export = t.ok_as(OTHER, &["export", "shared"]);
    assert!(export.contains("classified"), "{export}");
    let info = t.ok_as(OTHER, &["--json", "ns", "info", "shared"]);
    assert!(info.contains("\"owner_uid\":0"), "{info}");

    // Writes are refused, saying the grant is read-only.
    for args in [
        &["put", "shared", "0,0,0", "overwritten"][..],
        &["put", "shared", "9,9,9", "new"],
        &["del", "shared", "0,0,0"],
        &["del", "--detach", "shared", "0,0,0"],
        &["link", "shared", "0,0,0", "3,0,0"],
        &["unlink", "shared", "0,0,0", "1,0,0", "--label", "road"],
        &["prog", "shared", "2,0,0", "return 1"],
        &["prog", "--delete", "shared", "2,0,0"],
        &["run", "shared", "5,0,0"],
        &["step", "shared", "0,0,0", "9,9,9"],
        &["import", "shared", &file],
    ] {
        let err = t.refused_as(OTHER, args, "permission_denied");
        assert!(err.contains("read-only"), "{args:?}: {err}");
    }
    // Administering is the owner's and the administrators'.
    for args in [
        &["ns", "drop", "shared"][..],
        &["ns", "grant", "shared", "--uid", "65534"],
        &["ns", "grant", "shared", "--uid", "65533", "--read-only"],
        &["ns", "revoke", "shared", "--uid", "65534"],
    ] {
        let err = t.refused_as(OTHER, args, "permission_denied");
        assert!(err.contains("owner"), "{args:?}: {err}");
    }
    secret_intact(&mut root, "shared");
    assert_eq!(root.get("shared", c(6, 0, 0)).unwrap(), None, "a run ran");
    assert_eq!(root.get("shared", c(9, 9, 9)).unwrap(), None);
    let grants = root.ns_info(&name("shared")).unwrap().grants;
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert!(grants[0].uid == OTHER && grants[0].read_only, "{grants:?}");

    // A read-write grant writes (but still does not administer).
    grant(&mut root, "shared", OTHER, false);
    t.ok_as(OTHER, &["put", "shared", "0,0,0", "by nobody"]);
    assert_eq!(
        root.get("shared", c(0, 0, 0)).unwrap().as_deref(),
        Some(&b"by nobody"[..])
    );
    assert_eq!(t.ok_as(OTHER, &["run", "shared", "5,0,0"]).trim(), "1");
    t.ok_as(OTHER, &["link", "shared", "0,0,0", "3,0,0"]);
    assert_eq!(
        root.edges("shared", c(0, 0, 0), Direction::Out, None)
            .unwrap()
            .len(),
        2
    );
    t.ok_as(OTHER, &["del", "shared", "1,0,0"]);
    assert_eq!(root.get("shared", c(1, 0, 0)).unwrap(), None);
    let err = t.refused_as(OTHER, &["ns", "drop", "shared"], "permission_denied");
    assert!(err.contains("owner"), "{err}");
    t.refused_as(
        OTHER,
        &["ns", "grant", "shared", "--uid", "65533"],
        "permission_denied",
    );

    // Revoked: back to "no such namespace", for every command.
    revoke(&mut root, "shared", OTHER);
    for args in EVERY_COMMAND {
        t.hidden_like_missing(OTHER, "shared", &with_file(args, &file));
    }
    assert!(t.listed_for(OTHER).is_empty());
    assert_eq!(
        root.get("shared", c(0, 0, 0)).unwrap().as_deref(),
        Some(&b"by nobody"[..])
    );
}

#[test]
fn a_user_owns_and_administers_the_namespaces_it_creates() {
    if cannot_switch_uids("a_user_owns_and_administers_the_namespaces_it_creates") {
        return;
    }
    let t = Tenancy::start(&["--socket-mode", "666"]);
    let mut root = t.root();

    t.ok_as(OTHER, &["ns", "create", "mine"]);
    t.ok_as(OTHER, &["put", "mine", "0,0,0", "by nobody"]);
    t.ok_as(OTHER, &["link", "mine", "0,0,0", "1,0,0"]);
    t.ok_as(
        OTHER,
        &["prog", "mine", "2,0,0", "return cube.incr(3, 0, 0)"],
    );
    assert_eq!(t.ok_as(OTHER, &["run", "mine", "2,0,0"]).trim(), "1");
    assert_eq!(t.ok_as(OTHER, &["get", "mine", "0,0,0"]), "by nobody");
    let info = t.ok_as(OTHER, &["--json", "ns", "info", "mine"]);
    assert!(info.contains("\"owner_uid\":65534"), "{info}");
    let info = t.ok_as(OTHER, &["ns", "info", "mine"]);
    assert!(info.contains("uid 65534"), "{info}");
    assert_eq!(t.listed_for(OTHER), ["mine"]);

    // Root, an administrator, reads (and lists) it.
    assert_eq!(
        root.get("mine", c(0, 0, 0)).unwrap().as_deref(),
        Some(&b"by nobody"[..])
    );
    assert_eq!(root.ns_info(&name("mine")).unwrap().owner_uid, OTHER);
    assert!(root.ns_list().unwrap().iter().any(|n| n.as_str() == "mine"));

    // Another non-administrator sees nothing of it.
    let file = import_file(&t);
    for args in EVERY_COMMAND {
        t.hidden_like_missing(THIRD, "mine", &with_file(args, &file));
    }
    assert!(t.listed_for(THIRD).is_empty());
    t.refused_as(THIRD, &["ns", "create", "mine"], "namespace_exists");
    assert_eq!(root.ns_info(&name("mine")).unwrap().owner_uid, OTHER);

    // The owner shares it, and takes it back.
    t.ok_as(
        OTHER,
        &["ns", "grant", "mine", "--uid", "65533", "--read-only"],
    );
    assert_eq!(t.ok_as(THIRD, &["get", "mine", "0,0,0"]), "by nobody");
    assert_eq!(t.listed_for(THIRD), ["mine"]);
    let err = t.refused_as(
        THIRD,
        &["put", "mine", "0,0,0", "by the third"],
        "permission_denied",
    );
    assert!(err.contains("read-only"), "{err}");
    t.refused_as(THIRD, &["ns", "drop", "mine"], "permission_denied");
    t.ok_as(OTHER, &["ns", "revoke", "mine", "--uid", "65533"]);
    t.hidden_like_missing(THIRD, "mine", &["get", "NS", "0,0,0"]);

    // The third user's own namespace is as hidden from the second.
    t.ok_as(THIRD, &["ns", "create", "theirs"]);
    t.hidden_like_missing(OTHER, "theirs", &["get", "NS", "0,0,0"]);
    assert_eq!(t.listed_for(OTHER), ["mine"]);
    assert_eq!(t.listed_for(THIRD), ["theirs"]);

    // The owner drops it; the name is free again.
    t.ok_as(OTHER, &["ns", "drop", "mine"]);
    assert!(!root.ns_list().unwrap().iter().any(|n| n.as_str() == "mine"));
    assert!(t.listed_for(OTHER).is_empty());
    t.ok_as(THIRD, &["ns", "create", "mine"]);
    assert_eq!(root.ns_info(&name("mine")).unwrap().owner_uid, THIRD);
    assert_eq!(root.get("mine", c(0, 0, 0)).unwrap(), None);
    t.hidden_like_missing(OTHER, "mine", &["get", "NS", "0,0,0"]);
}

#[test]
fn the_default_namespace_is_the_administrators() {
    if cannot_switch_uids("the_default_namespace_is_the_administrators") {
        return;
    }
    let t = Tenancy::start(&["--socket-mode", "666"]);
    let mut root = t.root();
    root.put("default", c(0, 0, 0), b"admin data").unwrap();
    root.link("default", c(0, 0, 0), c(1, 0, 0), "", 1.0)
        .unwrap();
    assert_eq!(root.ns_info(&name("default")).unwrap().owner_uid, 0);

    let file = import_file(&t);
    for args in EVERY_COMMAND {
        t.hidden_like_missing(OTHER, "default", &with_file(args, &file));
    }
    assert!(t.listed_for(OTHER).is_empty());
    assert_eq!(
        root.get("default", c(0, 0, 0)).unwrap().as_deref(),
        Some(&b"admin data"[..])
    );
    assert_eq!(root.scan_count("default", &everywhere()).unwrap(), 1);
    assert_eq!(
        root.edges("default", c(0, 0, 0), Direction::Out, None)
            .unwrap()
            .len(),
        1
    );

    // An administrator can share it like any other.
    grant(&mut root, "default", OTHER, true);
    assert_eq!(t.ok_as(OTHER, &["get", "default", "0,0,0"]), "admin data");
    assert_eq!(t.listed_for(OTHER), ["default"]);
}

#[test]
fn checkpoint_and_backup_are_for_administrators_only() {
    if cannot_switch_uids("checkpoint_and_backup_are_for_administrators_only") {
        return;
    }
    let t = Tenancy::start(&["--socket-mode", "666"]);
    // Even an owner of a namespace is no administrator.
    t.ok_as(OTHER, &["ns", "create", "mine"]);
    t.ok_as(OTHER, &["put", "mine", "0,0,0", "x"]);
    let dest = t.dir.path().join("backup");
    let dest_arg = dest.to_str().unwrap();
    for args in [
        &["checkpoint"][..],
        &["checkpoint", "--compact"],
        &["--json", "checkpoint"],
        &["backup", dest_arg],
    ] {
        let err = t.refused_as(OTHER, args, "permission_denied");
        assert!(err.contains("administrator"), "{args:?}: {err}");
    }
    assert!(!dest.exists(), "a refused backup wrote {}", dest.display());
    let mut root = t.root();
    let stats = root.stats().unwrap();
    let checkpoints = stats.iter().find(|e| e.name == "checkpoint.count");
    assert_eq!(
        checkpoints.map(|e| &e.value),
        Some(&StatsValue::Count(0)),
        "a refused checkpoint ran"
    );
    // Root may.
    root.checkpoint(false).unwrap();
    root.backup(&dest).unwrap();
    assert!(dest.join("checkpoint").is_dir() || dest.join("wal").is_dir());
}

#[test]
fn allow_uid_and_the_socket_mode_refuse_at_connect() {
    if cannot_switch_uids("allow_uid_and_the_socket_mode_refuse_at_connect") {
        return;
    }
    let t = Tenancy::start(&[
        "--socket-mode",
        "666",
        "--allow-uid",
        "12345",
        "--allow-gid",
        "4242",
    ]);
    let mut root = t.root();
    create(&mut root, "open");
    grant(&mut root, "open", OTHER, false);
    grant(&mut root, "open", 12345, false);
    grant(&mut root, "open", 23456, false);

    // Not allowed: refused before any request, whatever the grants say.
    for args in [
        &["ping"][..],
        &["ns", "list"],
        &["get", "open", "0,0,0"],
        &["put", "open", "0,0,0", "x"],
    ] {
        // Exit 3: the daemon answered (with a refusal), unlike exit 4.
        let err = t.refused_as(OTHER, args, "permission_denied");
        assert!(
            err.contains("may not use") && err.contains("--allow-uid 65534"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(root.get("open", c(0, 0, 0)).unwrap(), None);

    // Allowed by uid, and by primary gid.
    t.ok_as(12345, &["ping"]);
    t.ok_as(12345, &["put", "open", "0,0,0", "from 12345"]);
    let out = t.run_as_ids(23456, 4242, &["get", "open", "0,0,0"]);
    expect_exit(&out, 0, "uid 23456 gid 4242");
    assert_eq!(out.stdout, b"from 12345");
    // Being let in grants nothing by itself.
    t.hidden_like_missing(12345, "default", &["get", "NS", "0,0,0"]);
    // The refusals were counted; the daemon still serves root.
    let refused = root
        .stats()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "connections.refused")
        .map(|e| e.value);
    assert!(
        matches!(refused, Some(StatsValue::Count(n)) if n >= 4),
        "connections.refused: {refused:?}"
    );
    root.ping().unwrap();

    // The default socket mode (0600): another uid cannot even connect.
    let private = Tenancy::start(&[]);
    let mode = fs::metadata(private.daemon.socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    for args in [&["ping"][..], &["get", "default", "0,0,0"]] {
        let out = private.run_as(OTHER, args);
        let err = expect_exit(&out, 4, &format!("{args:?}"));
        assert!(err.contains("cannot connect"), "{err}");
    }
    private.root().ping().unwrap();
}

/// Partitioning holds for one user too: nothing of one namespace is seen or
/// touched through another.
#[test]
fn nothing_crosses_from_one_namespace_to_another() {
    // Root only (no second uid needed), so this runs anywhere.
    let t = Tenancy::start(&[]);
    let mut root = t.root();
    for ns in ["a", "b"] {
        let info = match root
            .call(&Request::NsCreate {
                ns: name(ns),
                spec: NamespaceSpec::default(),
            })
            .unwrap()
        {
            Response::NsCreated(info) => info,
            other => panic!("{other:?}"),
        };
        assert_eq!(info.cells, 0);
    }
    let origin = c(0, 0, 0);
    root.put("a", origin, b"in a").unwrap();
    root.put("a", c(1, 0, 0), b"a's neighbour").unwrap();
    root.link("a", origin, c(1, 0, 0), "road", 1.0).unwrap();
    root.prog("a", c(7, 7, 7), b"return 'a program'").unwrap();

    // Nothing of a is in b, at the same coordinates.
    assert_eq!(root.get("b", origin).unwrap(), None);
    assert_eq!(root.scan_count("b", &everywhere()).unwrap(), 0);
    assert_eq!(root.scan("b", everywhere(), 100).count(), 0);
    assert_eq!(root.edges("b", origin, Direction::Both, None).unwrap(), []);
    assert_eq!(
        root.edges("b", c(1, 0, 0), Direction::Both, None).unwrap(),
        []
    );
    let walk = root.walk("b", origin, &WalkOptions::default()).unwrap();
    assert!(walk.nodes.is_empty(), "{walk:?}");
    let err = root.run("b", c(7, 7, 7), &[]).unwrap_err();
    assert!(code(&err).is_some(), "{err}");
    let stats = root.cell_stats("b", c(7, 7, 7), 10).unwrap();
    assert_eq!(stats.program_bytes, None, "{stats:?}");
    let info = root.ns_info(&name("b")).unwrap();
    assert_eq!(
        (info.cells, info.bytes, info.edges, info.programs),
        (0, 0, 0, 0)
    );

    // b gets its own data at the same coordinates; a's is unchanged.
    root.put("b", origin, b"in b").unwrap();
    root.link("b", origin, c(2, 0, 0), "rail", 5.0).unwrap();
    let a_edges = root.edges("a", origin, Direction::Both, None).unwrap();
    assert_eq!(a_edges.len(), 1, "{a_edges:?}");
    assert_eq!(a_edges[0].other, c(1, 0, 0));
    let b_edges = root.edges("b", origin, Direction::Both, None).unwrap();
    assert_eq!(b_edges.len(), 1, "{b_edges:?}");
    assert_eq!(b_edges[0].other, c(2, 0, 0));
    assert_eq!(
        root.get("a", origin).unwrap().as_deref(),
        Some(&b"in a"[..])
    );

    // A program in a reads, writes, counts and walks a only. The API has
    // no way to name another namespace: `cube.ns` is informational and
    // read-only, and a copy of the API with another `ns` still addresses
    // the program's own namespace.
    let prog = |root: &mut Client, source: &str| {
        root.prog("a", origin, source.as_bytes()).unwrap();
        root.run("a", origin, &[])
    };
    let reply = prog(
        &mut root,
        "cube.put(5, 5, 5, 'written by a') \
         local walk = cube.walk(8, 'both') \
         return {cube.ns, cube.get(0, 0, 0), cube.count(-100, -100, -100, 100, 100, 100), \
                 #cube.edges('both'), #walk, walk[1].x}",
    )
    .unwrap();
    assert_eq!(
        reply.value,
        ProgramValue::Table(vec![
            (ProgramValue::Int(1), bytes("a")),
            (ProgramValue::Int(2), bytes("in a")),
            (ProgramValue::Int(3), ProgramValue::Int(3)),
            (ProgramValue::Int(4), ProgramValue::Int(1)),
            (ProgramValue::Int(5), ProgramValue::Int(1)),
            (ProgramValue::Int(6), ProgramValue::Int(1)),
        ])
    );
    assert_eq!(
        root.get("a", c(5, 5, 5)).unwrap().as_deref(),
        Some(&b"written by a"[..])
    );
    assert_eq!(root.get("b", c(5, 5, 5)).unwrap(), None);

    // Attempts to point the API at b: refused, and nothing applied.
    for (source, says) in [
        ("cube.ns = 'b' cube.put(0, 0, 0, 'pwned')", "read-only"),
        (
            "rawset(cube, 'ns', 'b') cube.put(0, 0, 0, 'pwned')",
            "read-only",
        ),
        ("cube.put('b', 0, 0, 0, 'pwned')", ""),
        ("return cube.get('b', 0, 0, 0)", ""),
    ] {
        let err = prog(&mut root, source).unwrap_err();
        assert_eq!(code(&err), Some(ErrorCode::ProgramError), "{source}: {err}");
        assert!(err.to_string().contains(says), "{source}: {err}");
    }
    let reply = prog(
        &mut root,
        "local fake = setmetatable({ns = 'b'}, {__index = cube}) \
         fake.put(0, 0, 0, 'via a fake api') \
         return {fake.ns, fake.get(0, 0, 0), cube.ns}",
    )
    .unwrap();
    assert_eq!(
        reply.value,
        ProgramValue::Table(vec![
            (ProgramValue::Int(1), bytes("b")),
            (ProgramValue::Int(2), bytes("via a fake api")),
            (ProgramValue::Int(3), bytes("a")),
        ])
    );
    assert_eq!(
        root.get("a", origin).unwrap().as_deref(),
        Some(&b"via a fake api"[..]),
        "the write landed in a"
    );
    assert_eq!(
        root.get("b", origin).unwrap().as_deref(),
        Some(&b"in b"[..])
    );
    assert_eq!(root.scan_count("b", &everywhere()).unwrap(), 1);

    // A program in b runs in b.
    root.prog("b", c(7, 7, 7), b"return {cube.ns, cube.get(0, 0, 0)}")
        .unwrap();
    let reply = root.run("b", c(7, 7, 7), &[]).unwrap();
    assert_eq!(
        reply.value,
        ProgramValue::Table(vec![
            (ProgramValue::Int(1), bytes("b")),
            (ProgramValue::Int(2), bytes("in b")),
        ])
    );
    // Each namespace still runs its own program at 7,7,7.
    assert_eq!(
        root.run("a", c(7, 7, 7), &[]).unwrap().value,
        bytes("a program")
    );

    // Dropping a leaves b exactly as it was.
    root.ns_drop(&name("a")).unwrap();
    let err = root.get("a", origin).unwrap_err();
    assert_eq!(code(&err), Some(ErrorCode::NoSuchNamespace), "{err}");
    assert_eq!(
        root.get("b", origin).unwrap().as_deref(),
        Some(&b"in b"[..])
    );
    assert_eq!(root.scan_count("b", &everywhere()).unwrap(), 1);
    let b_edges = root.edges("b", origin, Direction::Both, None).unwrap();
    assert_eq!(b_edges.len(), 1, "{b_edges:?}");
    assert_eq!(
        root.run("b", c(7, 7, 7), &[]).unwrap().value,
        ProgramValue::Table(vec![
            (ProgramValue::Int(1), bytes("b")),
            (ProgramValue::Int(2), bytes("in b")),
        ])
    );
    let info = root.ns_info(&name("b")).unwrap();
    assert_eq!(
        (info.cells, info.edges, info.programs),
        (1, 1, 1),
        "{info:?}"
    );

    // A recreated a starts empty: nothing of the dropped one, nothing of b.
    create(&mut root, "a");
    assert_eq!(root.get("a", origin).unwrap(), None);
    assert_eq!(root.scan_count("a", &everywhere()).unwrap(), 0);
    assert_eq!(root.edges("a", origin, Direction::Both, None).unwrap(), []);
    assert!(root.run("a", c(7, 7, 7), &[]).is_err());

    // And all of it survives a restart the same way.
    let mut daemon = t.daemon;
    daemon.terminate().unwrap();
    daemon.restart().unwrap();
    let mut root = daemon.client().unwrap();
    assert_eq!(root.get("a", origin).unwrap(), None);
    assert_eq!(
        root.get("b", origin).unwrap().as_deref(),
        Some(&b"in b"[..])
    );
    assert_eq!(
        root.edges("b", origin, Direction::Both, None)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(root.ns_info(&name("b")).unwrap().programs, 1);
}

/// Owners and access lists are durable state like the data they guard: a
/// revoke is not undone and a grant not lost by a checkpoint or a restart,
/// and a dropped namespace's grants do not pass to a new one of its name.
#[test]
fn owners_and_grants_survive_checkpoint_and_restart_and_die_with_a_drop() {
    if cannot_switch_uids("owners_and_grants_survive_checkpoint_and_restart_and_die_with_a_drop") {
        return;
    }
    let mut t = Tenancy::start(&["--socket-mode", "666"]);
    t.ok_as(OTHER, &["ns", "create", "mine"]);
    t.ok_as(OTHER, &["put", "mine", "0,0,0", "by nobody"]);
    t.ok_as(
        OTHER,
        &["ns", "grant", "mine", "--uid", "65533", "--read-only"],
    );
    let mut root = t.root();
    create(&mut root, "shared");
    grant(&mut root, "shared", OTHER, false);
    grant(&mut root, "shared", THIRD, false);
    revoke(&mut root, "shared", THIRD);
    // Half of it folded into a checkpoint, the rest only in the log.
    root.checkpoint(true).unwrap();
    create(&mut root, "gone");
    grant(&mut root, "gone", OTHER, false);
    grant(&mut root, "shared", OTHER, true);
    drop(root);

    let check = |t: &Tenancy, when: &str| {
        let mut root = t.root();
        let info = root.ns_info(&name("mine")).unwrap();
        assert_eq!(info.owner_uid, OTHER, "{when}: {info:?}");
        assert_eq!(info.grants.len(), 1, "{when}: {info:?}");
        assert!(info.grants[0].uid == THIRD && info.grants[0].read_only);
        assert_eq!(t.ok_as(THIRD, &["get", "mine", "0,0,0"]), "by nobody");
        t.refused_as(THIRD, &["put", "mine", "0,0,0", "x"], "permission_denied");
        t.hidden_like_missing(THIRD, "shared", &["get", "NS", "0,0,0"]);
        let err = t.refused_as(OTHER, &["put", "shared", "0,0,0", "x"], "permission_denied");
        assert!(err.contains("read-only"), "{when}: {err}");
        assert_eq!(t.listed_for(OTHER), ["gone", "mine", "shared"], "{when}");
        assert_eq!(t.listed_for(THIRD), ["mine"], "{when}");
    };
    check(&t, "before restart");
    t.daemon.terminate().unwrap();
    t.daemon.restart().unwrap();
    check(&t, "after a clean restart");
    t.daemon.kill9().unwrap();
    t.daemon.restart().unwrap();
    check(&t, "after kill -9");

    // Dropped and created again by someone else: the old grant is gone.
    let mut root = t.root();
    root.ns_drop(&name("gone")).unwrap();
    t.ok_as(THIRD, &["ns", "create", "gone"]);
    t.ok_as(THIRD, &["put", "gone", "0,0,0", "the third's"]);
    t.hidden_like_missing(OTHER, "gone", &["get", "NS", "0,0,0"]);
    t.hidden_like_missing(OTHER, "gone", &["put", "NS", "0,0,0", "x"]);
    let info = root.ns_info(&name("gone")).unwrap();
    assert_eq!((info.owner_uid, info.grants.len()), (THIRD, 0), "{info:?}");
    drop(root);
    t.daemon.kill9().unwrap();
    t.daemon.restart().unwrap();
    t.hidden_like_missing(OTHER, "gone", &["get", "NS", "0,0,0"]);
    assert_eq!(t.ok_as(THIRD, &["get", "gone", "0,0,0"]), "the third's");
    assert_eq!(t.root().ns_info(&name("gone")).unwrap().owner_uid, THIRD);
}
