//! `cubec ns create|list|info|drop|grant|revoke`: arguments, output
//! formats and exit codes of the namespace commands
//! (`docs/protocol.md` section 6.9).

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use cube_client::{
    Client, ClientError, CurveChoice, ErrorCode, NamespaceInfo, NamespaceName, NamespaceSpec, json,
};
use serde_json::json;

use super::{EXIT_SERVER, Failure, emit, emit_line, parse_namespace_arg};

pub(crate) const NS_HELP: &str = "\
A namespace is a tenant: its cells, edges and programs are its own, and no
request reaches across namespaces. Each has a curve (fixed at creation),
optional quotas, an owner (the uid that created it) and an access list.
A fresh data directory has `default`.

Names are 1 to 64 of a-z, 0-9, '_' and '-'.

Examples:
  cubec ns create tenant-a --curve hilbert --max-cells 1000000 --max-bytes 1G
  cubec ns list
  cubec ns info tenant-a
  cubec ns grant tenant-a --uid 1001 --read-only
  cubec ns revoke tenant-a --uid 1001
  cubec ns drop tenant-a";

const CREATE_HELP: &str = "\
Creates an empty namespace owned by your uid. The curve orders its cells for
region reads and cannot change later; without --curve the daemon's default
is used. Quotas are checked before anything is logged: a write past one is
refused whole, with a message naming the quota. --max-bytes bounds the sum
of the values' lengths and takes K, M, G or T suffixes (1024-based: 10M is
10485760 bytes). --encrypted seals the namespace's data on disk with
AES-256-GCM; cubed must have been started with --key-file.

Examples:
  cubec ns create tenant-a
  cubec ns create maps --curve hilbert --max-cells 1000000 --max-bytes 512M
  cubec ns create secrets --encrypted
  cubec --json ns create scratch --max-edges 0";

const LIST_HELP: &str = "\
One name per line, sorted: the namespaces you own, those you have a grant
on, or (for cubed's own uid and root) all of them. With --json, one object:
{\"namespaces\":[...]}.

Examples:
  cubec ns list
  cubec --json ns list";

const INFO_HELP: &str = "\
Shows the namespace's id, curve, encryption, owner, what it holds (cells,
value bytes, edges, programs) against its quotas, and its access list.

Examples:
  cubec ns info default
  cubec --json ns info tenant-a";

const DROP_HELP: &str = "\
Removes the namespace and everything in it (values, edges, programs), in
one durable write, and frees its memory. The name can be created again
afterwards, as a new, empty namespace. Only the owner, cubed's uid and root
may drop a namespace. There is no undo.

Examples:
  cubec ns drop tenant-a
  cubec --json ns drop scratch";

const GRANT_HELP: &str = "\
Gives a uid access to the namespace: read and write, or with --read-only
only reads. A new grant replaces the uid's old one. Only the owner, cubed's
uid and root may grant. A uid without a grant cannot even see that the
namespace exists.

Examples:
  cubec ns grant tenant-a --uid 1001
  cubec ns grant tenant-a --uid 1002 --read-only";

const REVOKE_HELP: &str = "\
Takes a uid's access to the namespace away. Only the owner, cubed's uid and
root may revoke.

Examples:
  cubec ns revoke tenant-a --uid 1001";

#[derive(Debug, Args)]
pub(crate) struct NsArgs {
    #[command(subcommand)]
    pub(crate) command: NsCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NsCommand {
    /// Create a namespace (curve, quotas, encryption)
    #[command(after_help = CREATE_HELP)]
    Create(CreateArgs),

    /// List the namespaces you may see
    #[command(after_help = LIST_HELP)]
    List,

    /// Show a namespace's settings, use against its quotas, and access list
    #[command(after_help = INFO_HELP)]
    Info(NameArg),

    /// Drop a namespace and everything in it (the name can then be reused)
    #[command(after_help = DROP_HELP)]
    Drop(NameArg),

    /// Give a uid read-write (or --read-only) access to a namespace
    #[command(after_help = GRANT_HELP)]
    Grant(GrantArgs),

    /// Take a uid's access to a namespace away
    #[command(after_help = REVOKE_HELP)]
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct NameArg {
    /// Namespace name: 1 to 64 of a-z, 0-9, '_' and '-'
    #[arg(value_parser = parse_namespace_arg, value_name = "NAME")]
    pub(crate) name: NamespaceName,
}

/// The curves one may ask for by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CurveArg {
    /// Z-order: cheap to compute
    Morton,
    /// Better locality for region reads
    Hilbert,
}

#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    #[command(flatten)]
    pub(crate) ns: NameArg,

    /// Space-filling curve (fixed for the namespace's life; default: the daemon's)
    #[arg(long, value_enum, value_name = "CURVE")]
    pub(crate) curve: Option<CurveArg>,

    /// Most cells holding a value
    #[arg(long, value_name = "N")]
    pub(crate) max_cells: Option<u64>,

    /// Most value bytes stored, e.g. 1048576, 512M or 1G (K/M/G/T are 1024-based)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) max_bytes: Option<u64>,

    /// Most edges
    #[arg(long, value_name = "N")]
    pub(crate) max_edges: Option<u64>,

    /// Encrypt the namespace's data at rest (cubed needs --key-file)
    #[arg(long)]
    pub(crate) encrypted: bool,
}

#[derive(Debug, Args)]
pub(crate) struct GrantArgs {
    #[command(flatten)]
    pub(crate) ns: NameArg,

    /// The user to give access to (numeric uid, as `id -u` prints it)
    #[arg(long, value_name = "UID")]
    pub(crate) uid: u32,

    /// Reads only; without it the grant is read-write
    #[arg(long)]
    pub(crate) read_only: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RevokeArgs {
    #[command(flatten)]
    pub(crate) ns: NameArg,

    /// The user whose access to take away (numeric uid)
    #[arg(long, value_name = "UID")]
    pub(crate) uid: u32,
}

/// A byte count: digits, optionally followed by K, M, G or T (1024-based;
/// `KiB`, `MiB`... are accepted too).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    let bad = || {
        format!(
            "bad size {text:?}: give a whole number of bytes, optionally with K, M, G or T \
             (1024-based), e.g. 1048576, 512M or 1G"
        )
    };
    if digits.is_empty() {
        return Err(bad());
    }
    let shift = match suffix.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return Err(bad()),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {text:?} is over {} bytes", u64::MAX))
}

pub(crate) fn run(
    client: &mut Client,
    args: &NsArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    match &args.command {
        NsCommand::Create(args) => create(client, args, as_json, out),
        NsCommand::List => list(client, as_json, out),
        NsCommand::Info(NameArg { name }) => {
            let info = client
                .ns_info(name)
                .map_err(|e| failure(e, name, Doing::Use))?;
            emit(out, describe(&info, as_json).as_bytes())?;
            Ok(0)
        }
        NsCommand::Drop(NameArg { name }) => {
            let (lsn, cells) = client
                .ns_drop(name)
                .map_err(|e| failure(e, name, Doing::Administer))?;
            let line = if as_json {
                json::to_string(&json!({
                    "name": name.as_str(),
                    "dropped": true,
                    "cells": cells,
                    "lsn": lsn,
                }))
            } else {
                let plural = if cells == 1 { "" } else { "s" };
                format!("dropped namespace {name} and its {cells} cell{plural} (lsn {lsn})")
            };
            emit_line(out, &line)?;
            Ok(0)
        }
        NsCommand::Grant(args) => {
            let name = &args.ns.name;
            let info = client
                .ns_grant(name, args.uid, args.read_only)
                .map_err(|e| failure(e, name, Doing::Administer))?;
            if as_json {
                emit(out, describe(&info, true).as_bytes())?;
            } else {
                let access = if args.read_only {
                    "read-only"
                } else {
                    "read-write"
                };
                emit_line(
                    out,
                    &format!("granted uid {} {access} access to {name}", args.uid),
                )?;
            }
            Ok(0)
        }
        NsCommand::Revoke(args) => {
            let name = &args.ns.name;
            let info = client
                .ns_revoke(name, args.uid)
                .map_err(|e| failure(e, name, Doing::Administer))?;
            if as_json {
                emit(out, describe(&info, true).as_bytes())?;
            } else {
                emit_line(out, &format!("revoked uid {}'s access to {name}", args.uid))?;
            }
            Ok(0)
        }
    }
}

fn create(
    client: &mut Client,
    args: &CreateArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let spec = NamespaceSpec {
        curve: match args.curve {
            None => CurveChoice::ServerDefault,
            Some(CurveArg::Morton) => CurveChoice::Morton,
            Some(CurveArg::Hilbert) => CurveChoice::Hilbert,
        },
        max_cells: args.max_cells,
        max_bytes: args.max_bytes,
        max_edges: args.max_edges,
        encrypted: args.encrypted,
    };
    let name = &args.ns.name;
    let info = client
        .ns_create(name, &spec)
        .map_err(|e| failure(e, name, Doing::Create))?;
    if as_json {
        emit(out, describe(&info, true).as_bytes())?;
    } else {
        emit_line(out, &format!("created namespace {name}"))?;
        emit(out, describe(&info, false).as_bytes())?;
    }
    Ok(0)
}

fn list(client: &mut Client, as_json: bool, out: &mut impl Write) -> Result<u8, Failure> {
    let names = client.ns_list()?;
    if as_json {
        let names: Vec<&str> = names.iter().map(NamespaceName::as_str).collect();
        emit_line(out, &json::to_string(&json!({"namespaces": names})))?;
    } else {
        let mut text = String::new();
        for name in &names {
            text.push_str(name.as_str());
            text.push('\n');
        }
        emit(out, text.as_bytes())?;
    }
    Ok(0)
}

/// What the failed command was doing, which decides the advice.
#[derive(Clone, Copy)]
enum Doing {
    Create,
    Use,
    Administer,
}

/// A server refusal about namespace `name`, with the next step spelled out
/// for this very name; anything else as every command reports it.
fn failure(error: ClientError, name: &NamespaceName, doing: Doing) -> Failure {
    let step = match (error.server_code(), doing) {
        (Some(ErrorCode::NamespaceExists), _) => {
            format!("choose another name, or `cubec ns drop {name}` first")
        }
        // cubed's own message already names --key-file: say it once.
        (Some(ErrorCode::EncryptionUnavailable), _) if error.to_string().contains("--key-file") => {
            "the key file holds 32 raw bytes or 64 hex digits and must be chmod 600; \
             or create the namespace without --encrypted"
                .to_owned()
        }
        (Some(ErrorCode::EncryptionUnavailable), _) => {
            "restart cubed with --key-file PATH (a 32-byte key, chmod 600), \
             or create the namespace without --encrypted"
                .to_owned()
        }
        (Some(ErrorCode::NoSuchNamespace), Doing::Use | Doing::Administer) => format!(
            "check the name: `cubec ns list` shows the namespaces you may see, \
             and `cubec ns create {name}` makes it"
        ),
        (Some(ErrorCode::PermissionDenied), Doing::Administer) => format!(
            "only the owner of {name}, cubed's own uid and root may do this; \
             ask one of them (`cubec ns info {name}` shows the owner)"
        ),
        (Some(ErrorCode::PermissionDenied), _) => format!(
            "ask the namespace owner or an administrator: cubec ns grant {name} --uid {}",
            own_uid()
        ),
        (Some(ErrorCode::LimitExceeded), Doing::Administer) => format!(
            "{name} has as many grants as allowed; revoke one first (`cubec ns info {name}` \
             lists them)"
        ),
        _ => return Failure::from(error),
    };
    Failure {
        code: EXIT_SERVER,
        message: format!("{error}; {step}"),
        reported_as_json: false,
    }
}

/// This process's uid, for advice; `YOUR_UID` if it cannot be read.
fn own_uid() -> String {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's (effective) uid; no unsafe libc
    // call needed.
    std::fs::metadata("/proc/self").map_or_else(|_| "YOUR_UID".to_owned(), |m| m.uid().to_string())
}

/// `used of limit (p%)`, or `used (no quota)`.
fn against_quota(used: u64, limit: Option<u64>) -> String {
    let Some(limit) = limit else {
        return format!("{used} (no quota)");
    };
    let share = if limit == 0 {
        "full".to_owned()
    } else {
        let percent = used as f64 * 100.0 / limit as f64;
        if used > 0 && percent < 0.1 {
            "<0.1%".to_owned()
        } else {
            format!("{percent:.1}%")
        }
    };
    format!("{used} of {limit} ({share})")
}

/// A namespace description: aligned `key: value` lines, or one JSON object
/// (both end with a newline).
pub(crate) fn describe(info: &NamespaceInfo, as_json: bool) -> String {
    if as_json {
        return describe_json(info);
    }
    let grants: Vec<String> = info
        .grants
        .iter()
        .map(|g| {
            format!(
                "uid {} {}",
                g.uid,
                if g.read_only {
                    "read-only"
                } else {
                    "read-write"
                }
            )
        })
        .collect();
    let rows = [
        ("name", info.name.to_string()),
        ("id", info.id.to_string()),
        ("curve", info.curve.to_string()),
        (
            "encrypted",
            if info.encrypted { "yes" } else { "no" }.to_owned(),
        ),
        ("owner", format!("uid {}", info.owner_uid)),
        ("cells", against_quota(info.cells, info.max_cells)),
        ("bytes", against_quota(info.bytes, info.max_bytes)),
        ("edges", against_quota(info.edges, info.max_edges)),
        ("programs", info.programs.to_string()),
        (
            "grants",
            if grants.is_empty() {
                "none (only the owner and administrators)".to_owned()
            } else {
                grants.join(", ")
            },
        ),
    ];
    let width = rows.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut text = String::new();
    for (key, value) in rows {
        text.push_str(&format!("{:<width$} {value}\n", format!("{key}:")));
    }
    text
}

fn describe_json(info: &NamespaceInfo) -> String {
    let grants: Vec<_> = info
        .grants
        .iter()
        .map(|g| json!({"uid": g.uid, "read_only": g.read_only}))
        .collect();
    let object = json!({
        "name": info.name.as_str(),
        "id": info.id,
        "curve": info.curve.name(),
        "encrypted": info.encrypted,
        "owner_uid": info.owner_uid,
        "cells": info.cells,
        "bytes": info.bytes,
        "edges": info.edges,
        "programs": info.programs,
        "max_cells": info.max_cells,
        "max_bytes": info.max_bytes,
        "max_edges": info.max_edges,
        "grants": grants,
    });
    format!("{}\n", json::to_string(&object))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cube_client::{NamespaceGrant, ServerError};

    use super::*;

    fn info() -> NamespaceInfo {
        NamespaceInfo {
            name: NamespaceName::new("tenant-a").unwrap(),
            id: 2,
            curve: CurveChoice::Hilbert,
            encrypted: true,
            owner_uid: 1000,
            cells: 12,
            bytes: 345,
            edges: 6,
            programs: 1,
            max_cells: Some(1000),
            max_bytes: Some(10 << 20),
            max_edges: None,
            grants: vec![
                NamespaceGrant {
                    uid: 1001,
                    read_only: true,
                },
                NamespaceGrant {
                    uid: 1002,
                    read_only: false,
                },
            ],
        }
    }

    fn parse(args: &[&str]) -> Result<super::super::Cli, clap::Error> {
        use clap::Parser;
        super::super::Cli::try_parse_from(std::iter::once("cubec").chain(args.iter().copied()))
    }

    fn ns_command(args: &[&str]) -> NsCommand {
        match parse(args).unwrap().command {
            super::super::Command::Ns(NsArgs { command }) => command,
            other => panic!("not ns: {other:?}"),
        }
    }

    #[test]
    fn create_takes_curve_quotas_and_encryption() {
        let NsCommand::Create(args) = ns_command(&[
            "ns",
            "create",
            "tenant-a",
            "--curve",
            "hilbert",
            "--max-cells",
            "1000",
            "--max-bytes",
            "10M",
            "--max-edges",
            "0",
            "--encrypted",
        ]) else {
            panic!("not create")
        };
        assert_eq!(args.ns.name.as_str(), "tenant-a");
        assert_eq!(args.curve, Some(CurveArg::Hilbert));
        assert_eq!(
            (args.max_cells, args.max_bytes, args.max_edges),
            (Some(1000), Some(10 << 20), Some(0))
        );
        assert!(args.encrypted);
        let NsCommand::Create(args) = ns_command(&["--json", "ns", "create", "x"]) else {
            panic!("not create")
        };
        assert_eq!(
            (args.curve, args.max_bytes, args.encrypted),
            (None, None, false)
        );
    }

    #[test]
    fn bad_names_curves_sizes_and_uids_are_usage_errors() {
        use clap::error::ErrorKind;
        for args in [
            &["ns", "create", "Tenant"][..],
            &["ns", "info", "a b"],
            &["ns", "drop", &"x".repeat(65)],
            &["ns", "create", "t", "--curve", "peano"],
            &["ns", "create", "t", "--max-bytes", "1.5G"],
            &["ns", "create", "t", "--max-cells", "-1"],
            &["ns", "grant", "t", "--uid", "root"],
            &["ns", "revoke", "t", "--uid", "4294967296"],
        ] {
            let err = parse(args).unwrap_err();
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::ValueValidation
                        | ErrorKind::InvalidValue
                        | ErrorKind::UnknownArgument
                ),
                "{args:?}: {err}"
            );
            assert_eq!(err.exit_code(), i32::from(super::super::EXIT_USAGE));
        }
        let err = parse(&["ns", "create", "Tenant"]).unwrap_err();
        assert!(err.to_string().contains("only a-z"), "{err}");
        let err = parse(&["ns", "grant", "t"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn grant_revoke_list_info_drop_parse() {
        let NsCommand::Grant(args) =
            ns_command(&["ns", "grant", "t", "--uid", "1001", "--read-only"])
        else {
            panic!("not grant")
        };
        assert_eq!(
            (args.ns.name.as_str(), args.uid, args.read_only),
            ("t", 1001, true)
        );
        let NsCommand::Revoke(args) = ns_command(&["ns", "revoke", "t", "--uid", "0"]) else {
            panic!("not revoke")
        };
        assert_eq!(args.uid, 0);
        assert!(matches!(ns_command(&["ns", "list"]), NsCommand::List));
        assert!(matches!(
            ns_command(&["ns", "info", "t"]),
            NsCommand::Info(_)
        ));
        assert!(matches!(
            ns_command(&["ns", "drop", "t"]),
            NsCommand::Drop(_)
        ));
    }

    #[test]
    fn every_ns_command_has_help_with_an_example() {
        use clap::CommandFactory;
        let mut cli = super::super::Cli::command();
        let ns = cli.find_subcommand_mut("ns").unwrap();
        for sub in ["create", "list", "info", "drop", "grant", "revoke"] {
            let help = ns
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            assert!(
                help.contains(&format!("cubec ns {sub}")) || help.contains("cubec --json ns"),
                "{sub}: {help}"
            );
        }
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("10M"), Ok(10 << 20));
        assert_eq!(parse_size("10m"), Ok(10 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("2 T"), Ok(2 << 40));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "M", "1.5G", "-1", "10MB", "10X", "1e6"] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains("512M or 1G"), "{bad}: {err}");
        }
        assert!(parse_size("99999999T").unwrap_err().contains("over"));
    }

    #[test]
    fn info_is_aligned_key_value_lines_with_quota_use() {
        assert_eq!(
            describe(&info(), false),
            "\
name:      tenant-a
id:        2
curve:     hilbert
encrypted: yes
owner:     uid 1000
cells:     12 of 1000 (1.2%)
bytes:     345 of 10485760 (<0.1%)
edges:     6 (no quota)
programs:  1
grants:    uid 1001 read-only, uid 1002 read-write
"
        );
        assert_eq!(against_quota(0, Some(0)), "0 of 0 (full)");
        assert_eq!(against_quota(0, Some(10)), "0 of 10 (0.0%)");
        assert_eq!(against_quota(10, Some(10)), "10 of 10 (100.0%)");
    }

    #[test]
    fn info_json_is_one_flat_object() {
        assert_eq!(
            describe(&info(), true),
            "{\"name\":\"tenant-a\",\"id\":2,\"curve\":\"hilbert\",\"encrypted\":true,\
             \"owner_uid\":1000,\"cells\":12,\"bytes\":345,\"edges\":6,\"programs\":1,\
             \"max_cells\":1000,\"max_bytes\":10485760,\"max_edges\":null,\
             \"grants\":[{\"uid\":1001,\"read_only\":true},{\"uid\":1002,\"read_only\":false}]}\n"
        );
    }

    #[test]
    fn refusals_say_what_to_do_next_for_this_name() {
        let name = NamespaceName::new("tenant-a").unwrap();
        let refusal = |code, message: &str| ClientError::Server(ServerError::new(code, message));
        let f = failure(
            refusal(ErrorCode::NamespaceExists, "namespace tenant-a exists"),
            &name,
            Doing::Create,
        );
        assert_eq!(f.code, EXIT_SERVER);
        assert!(
            f.message
                .ends_with("; choose another name, or `cubec ns drop tenant-a` first"),
            "{}",
            f.message
        );
        let f = failure(
            refusal(ErrorCode::EncryptionUnavailable, "no key"),
            &name,
            Doing::Create,
        );
        assert!(f.message.contains("--key-file PATH"), "{}", f.message);
        // cubed's own refusal names the flag; the advice does not repeat it.
        let f = failure(
            refusal(
                ErrorCode::EncryptionUnavailable,
                "an encrypted namespace needs a master key: start cubed with --key-file PATH",
            ),
            &name,
            Doing::Create,
        );
        assert_eq!(f.message.matches("--key-file").count(), 1, "{}", f.message);
        assert!(f.message.contains("without --encrypted"), "{}", f.message);
        let f = failure(
            refusal(ErrorCode::PermissionDenied, "read-only grant"),
            &name,
            Doing::Use,
        );
        assert!(
            f.message.contains("cubec ns grant tenant-a --uid "),
            "{}",
            f.message
        );
        let f = failure(
            refusal(ErrorCode::PermissionDenied, "not the owner"),
            &name,
            Doing::Administer,
        );
        assert!(f.message.contains("only the owner"), "{}", f.message);
        let f = failure(
            refusal(ErrorCode::NoSuchNamespace, "no namespace tenant-a"),
            &name,
            Doing::Use,
        );
        assert!(f.message.contains("cubec ns list"), "{}", f.message);
        let f = failure(ClientError::BadArgument("x".to_owned()), &name, Doing::Use);
        assert_eq!(f.code, super::super::EXIT_USAGE);
    }
}
