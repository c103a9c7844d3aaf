//! `cubec watch`: print the changes inside a box as they commit.

use std::io::Write;

use clap::Args;
use cube_client::{CellBox, Client, WatchChange, WatchOp, json};
use serde_json::{Value, json};

use crate::args::BoxArgs;
use crate::{Failure, coord_json, emit, escape_value};

pub(crate) const WATCH_HELP: &str = "\
Prints one line per change inside the box, in LSN order, as it commits:
`lsn<TAB>x,y,z<TAB>op<TAB>value`, op one of put, del (no value), link and
unlink (value `TO<TAB>LABEL<TAB>WEIGHT`, unlink without the weight), prog
(value: the source) and unprog. Values are escaped as `cubec scan` does.
With --json, one object per line. A commit group's changes are printed
together and flushed at once. Runs until interrupted (Ctrl-C).

Without --from it starts with the next change. With --from LSN it first
prints every change from LSN on that the log still holds, then follows
live, missing none and repeating none. To resume after an interruption,
pass --from the last LSN printed plus one.

If the log no longer holds LSN (folded into a checkpoint), or the watcher
fell behind cubed's --watch-buffer-bytes, it exits 3 saying from which
LSN to go on: re-read the box with `cubec scan --lsn` and watch --from
the LSN after the scan's (docs/operations.md, \"Following a box\").

Examples:
  cubec watch default 0,0,0 15,15,15
  cubec watch default 0,0,0 15,15,15 --from 1042
  cubec --json watch default -8,-8,0 8,8,0";

#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// The namespace and the box
    #[command(flatten)]
    region: BoxArgs,

    /// Replay the changes from this LSN on first (at least 1)
    #[arg(long, value_name = "LSN", value_parser = clap::value_parser!(u64).range(1..))]
    from: Option<u64>,
}

pub(crate) fn watch(
    client: Client,
    args: &WatchArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let region = CellBox::new(args.region.lo, args.region.hi)
        .map_err(|why| Failure::usage(format!("{why}; see `cubec help watch`")))?;
    let watch = client.watch(args.region.ns.as_str(), region, args.from)?;
    let mut line = Vec::with_capacity(256);
    for group in watch {
        let group = group?;
        line.clear();
        for change in &group.changes {
            if as_json {
                line.extend_from_slice(change_json(change).as_bytes());
            } else {
                change_text(change, &mut line);
            }
            line.push(b'\n');
        }
        emit(out, &line)?;
        out.flush()
            .map_err(|e| Failure::usage(format!("cannot write to stdout: {e}")))?;
    }
    Ok(0)
}

/// `lsn<TAB>x,y,z<TAB>op<TAB>value`.
fn change_text(change: &WatchChange, line: &mut Vec<u8>) {
    line.extend_from_slice(
        format!("{}\t{}\t{}", change.lsn, change.coord, change.op.name()).as_bytes(),
    );
    match &change.op {
        WatchOp::Put(value) | WatchOp::ProgramPut(value) => {
            line.push(b'\t');
            escape_value(value, line);
        }
        WatchOp::Del | WatchOp::ProgramDel => {}
        WatchOp::Link { to, label, weight } => {
            line.extend_from_slice(format!("\t{to}\t").as_bytes());
            escape_value(label.as_str().as_bytes(), line);
            line.extend_from_slice(format!("\t{weight}").as_bytes());
        }
        WatchOp::Unlink { to, label } => {
            line.extend_from_slice(format!("\t{to}\t").as_bytes());
            escape_value(label.as_str().as_bytes(), line);
        }
    }
}

/// One JSON object: lsn, coord, op and what the op carries (values and
/// sources exact, in base64, and as text when they are UTF-8).
fn change_json(change: &WatchChange) -> String {
    let mut object = json!({
        "lsn": change.lsn,
        "coord": coord_json(change.coord),
        "op": change.op.name(),
    });
    let rest = match &change.op {
        WatchOp::Put(bytes) | WatchOp::ProgramPut(bytes) => json!({
            "value": std::str::from_utf8(bytes).ok(),
            "value_base64": cube_client::base64::encode(bytes),
        }),
        WatchOp::Del | WatchOp::ProgramDel => json!({}),
        WatchOp::Link { to, label, weight } => json!({
            "to": coord_json(*to),
            "label": label.as_str(),
            "weight": weight,
        }),
        WatchOp::Unlink { to, label } => json!({
            "to": coord_json(*to),
            "label": label.as_str(),
        }),
    };
    if let (Some(fields), Value::Object(rest)) = (object.as_object_mut(), rest) {
        fields.extend(rest);
    }
    json::to_string(&object)
}
