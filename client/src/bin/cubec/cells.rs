//! `cubec put`, `get`, `del` and `scan`: the values of cells.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use clap::{ArgGroup, Args};
use cube_client::{
    CellBox, Client, Coord, MAX_SCAN_PAGE_CELLS, ScanPage, base64, json, parse_coord,
};
use serde_json::json;

use crate::EXIT_NOT_FOUND;
use crate::args::{BoxArgs, CellArgs};
use crate::failure::Failure;
use crate::output::{cell_json, coord_json, emit, emit_line, escape_value};

#[derive(Debug, Args)]
pub(crate) struct ScanArgs {
    /// The namespace and the box
    #[command(flatten)]
    pub(crate) region: BoxArgs,

    /// Print at most N cells; if the box holds more, say on stderr how to continue
    #[arg(long, value_name = "N")]
    pub(crate) limit: Option<u64>,

    /// Print only the number of cells in the box
    #[arg(long, conflicts_with_all = ["limit", "after"])]
    pub(crate) count: bool,

    /// Start strictly after this cell (the position printed when --limit stopped early)
    #[arg(long, value_parser = parse_coord, allow_hyphen_values = true, value_name = "X,Y,Z")]
    pub(crate) after: Option<Coord>,

    /// Also say which LSN the cells are at (on stderr; with --json, a first
    /// line `{"lsn":N}`): `cubec watch --from N+1` then misses no change
    #[arg(long, conflicts_with = "count")]
    pub(crate) lsn: bool,

    /// Cells fetched per request (at most 65536)
    #[arg(long, value_name = "N", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SCAN_PAGE_CELLS)))]
    pub(crate) page_size: u32,
}

#[derive(Debug, Args)]
pub(crate) struct DelArgs {
    #[command(flatten)]
    pub(crate) cell: CellArgs,

    /// Also remove every edge into or out of the cell, atomically with the value
    #[arg(long)]
    pub(crate) detach: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["value", "file"])))]
pub(crate) struct PutArgs {
    #[command(flatten)]
    pub(crate) cell: CellArgs,

    /// The value's bytes, or `-` to read them from stdin
    #[arg(allow_hyphen_values = true, value_name = "VALUE")]
    pub(crate) value: Option<OsString>,

    /// Read the value from this file
    #[arg(long, value_name = "PATH")]
    pub(crate) file: Option<PathBuf>,
}

fn read_value(args: &PutArgs) -> Result<Vec<u8>, Failure> {
    match (&args.value, &args.file) {
        (Some(value), None) if value == "-" => {
            let mut bytes = Vec::new();
            io::stdin().lock().read_to_end(&mut bytes).map_err(|e| {
                Failure::usage(format!(
                    "cannot read the value from stdin: {e}; pipe the value in or pass it as an argument"
                ))
            })?;
            Ok(bytes)
        }
        // Unix arguments are bytes; keep them exactly, even when not UTF-8.
        (Some(value), None) => Ok(value.clone().into_vec()),
        (None, Some(path)) => std::fs::read(path).map_err(|e| {
            Failure::usage(format!(
                "cannot read value file {}: {e}; check the path and permissions",
                path.display()
            ))
        }),
        // clap's "source" group already demands exactly one.
        _ => Err(Failure::usage(
            "give exactly one value source: VALUE, `-` for stdin, or --file PATH; \
             see `cubec help put`"
                .to_owned(),
        )),
    }
}

pub(crate) fn put(
    client: &mut Client,
    args: &PutArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let value = read_value(args)?;
    let lsn = client.put(args.cell.ns.as_str(), args.cell.coord, &value)?;
    let line = if as_json {
        cell_json(&args.cell, json!({"bytes": value.len(), "lsn": lsn}))
    } else {
        format!(
            "stored {} bytes at {} {} (lsn {lsn})",
            value.len(),
            args.cell.ns,
            args.cell.coord
        )
    };
    emit_line(out, &line)?;
    Ok(0)
}

pub(crate) fn get(
    client: &mut Client,
    args: &CellArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let value = client.get(args.ns.as_str(), args.coord)?;
    if as_json {
        let line = match &value {
            Some(bytes) => cell_json(
                args,
                json!({
                    "found": true,
                    "value": std::str::from_utf8(bytes).ok(),
                    "value_base64": base64::encode(bytes),
                }),
            ),
            None => cell_json(
                args,
                json!({"found": false, "value": null, "value_base64": null}),
            ),
        };
        emit_line(out, &line)?;
    } else if let Some(bytes) = &value {
        emit(out, bytes)?;
    } else {
        eprintln!("cubec: no value at {} {}", args.ns, args.coord);
    }
    Ok(if value.is_some() { 0 } else { EXIT_NOT_FOUND })
}

pub(crate) fn del(
    client: &mut Client,
    args: &CellArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let existed = client.del(args.ns.as_str(), args.coord)?;
    if as_json {
        emit_line(out, &cell_json(args, json!({"existed": existed})))?;
    } else if existed {
        emit_line(out, &format!("deleted {} {}", args.ns, args.coord))?;
    } else {
        eprintln!(
            "cubec: no value at {} {}; nothing deleted",
            args.ns, args.coord
        );
    }
    Ok(if existed { 0 } else { EXIT_NOT_FOUND })
}

pub(crate) fn scan(
    client: &mut Client,
    args: &ScanArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let region = CellBox::new(args.region.lo, args.region.hi)
        .map_err(|why| Failure::usage(format!("{why}; see `cubec help scan`")))?;
    if args.count {
        return scan_count(client, args, &region, as_json, out);
    }
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    let mut after = args.after;
    let mut line = Vec::with_capacity(256);
    while printed < limit {
        let want = (limit - printed).min(u64::from(args.page_size)) as u32;
        let page = if args.lsn && printed == 0 && after == args.after {
            first_page_with_lsn(client, args, &region, want, as_json, out)?
        } else {
            client.scan_page(args.region.ns.as_str(), &region, want, after)?
        };
        for cell in &page.cells {
            line.clear();
            if as_json {
                line.extend_from_slice(scan_cell_json(cell.coord, &cell.value).as_bytes());
            } else {
                line.extend_from_slice(format!("{}\t", cell.coord).as_bytes());
                escape_value(&cell.value, &mut line);
            }
            line.push(b'\n');
            emit(out, &line)?;
            printed += 1;
        }
        match page.resume_after {
            None => return Ok(0),
            Some(next) => after = Some(next),
        }
    }
    if let Some(position) = after {
        eprintln!(
            "cubec: stopped after {printed} cells (--limit); the box may hold more: \
             continue with --after {position}"
        );
    }
    Ok(0)
}

/// `scan --count`: the number of cells in the box.
fn scan_count(
    client: &mut Client,
    args: &ScanArgs,
    region: &CellBox,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let count = client.scan_count(args.region.ns.as_str(), region)?;
    let line = if as_json {
        json::to_string(&json!({
            "ns": args.region.ns.as_str(),
            "lo": coord_json(args.region.lo),
            "hi": coord_json(args.region.hi),
            "count": count,
        }))
    } else {
        count.to_string()
    };
    emit_line(out, &line)?;
    Ok(0)
}

/// `scan --lsn`'s first page, and the LSN its cells are at: a JSON line
/// before the cells, or a note on stderr saying how to follow on.
fn first_page_with_lsn(
    client: &mut Client,
    args: &ScanArgs,
    region: &CellBox,
    want: u32,
    as_json: bool,
    out: &mut impl Write,
) -> Result<ScanPage, Failure> {
    let (page, lsn) =
        client.scan_page_with_lsn(args.region.ns.as_str(), region, want, args.after)?;
    if as_json {
        emit_line(out, &json::to_string(&json!({"lsn": lsn})))?;
    } else {
        eprintln!(
            "cubec: the cells are at LSN {lsn} (every change up to it is in them); \
             follow on with `cubec watch {} {} {} --from {}`",
            args.region.ns,
            args.region.lo,
            args.region.hi,
            lsn + 1
        );
    }
    Ok(page)
}

fn scan_cell_json(coord: Coord, value: &[u8]) -> String {
    json::to_string(&json!({
        "coord": coord_json(coord),
        "value": std::str::from_utf8(value).ok(),
        "value_base64": base64::encode(value),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn scan_values_are_escaped_to_one_line() {
        let mut out = Vec::new();
        escape_value(b"a\tb\nc\\d\x01\xffz\xc3\xa9", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a\\tb\\nc\\\\d\\x01\\xffz\u{e9}"
        );
        // Characters other tools split lines at.
        let mut out = Vec::new();
        escape_value("\u{85}\u{2028}\u{2029} nel".as_bytes(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\\u{85}\\u{2028}\\u{2029} nel"
        );
        assert_eq!(
            scan_cell_json(Coord::new(1, -2, 3), b"hi"),
            "{\"coord\":[1,-2,3],\"value\":\"hi\",\"value_base64\":\"aGk=\"}"
        );
    }
}
