//! `cubec export`: a namespace's cells, edges and programs to stdout, as
//! JSON lines or (cells only) CSV.

use std::io::{self, BufWriter, IsTerminal, Write};
use std::time::Instant;

use clap::Args;
use cube_client::{
    CellBox, Client, ClientError, Coord, MAX_EDGE_PAGE, MAX_PROGRAM_PAGE, MAX_SCAN_PAGE_CELLS,
    NamespaceName, parse_coord,
};

use crate::{Failure, parse_namespace_arg};

use super::Format;
use super::csv::CsvWriter;
use super::jsonl::{cell_line, edge_line, program_line};

pub(crate) const EXPORT_HELP: &str = "\
Writes the namespace's cells (in curve order), then its edges, then its
programs to stdout, one JSON object per line:

  {\"type\":\"cell\",\"coord\":[1,2,3],\"value\":\"hello\"}
  {\"type\":\"cell\",\"coord\":[1,2,4],\"value_base64\":\"/wA=\"}
  {\"type\":\"edge\",\"from\":[0,0,0],\"to\":[1,0,0],\"label\":\"road\",\"weight\":2.5}
  {\"type\":\"program\",\"coord\":[0,0,0],\"source\":\"return 1\"}

A value (or program source) that is not UTF-8 comes as value_base64 (or
source_base64) instead, so `cubec import` restores every byte. With
--region, only cells and programs inside the box and edges leaving it.
--format csv writes cells only: a header `x,y,z,value`, the value as text
(RFC 4180 quoting), or `base64:` and the bytes in base64 when they are not
UTF-8 or the text itself starts with `base64:`. The export is not a
snapshot: writes made while it runs may or may not be in it; everything
that exists throughout is, exactly once.

Examples:
  cubec export default > default.jsonl
  cubec export default --region -10,-10,0 10,10,0 > part.jsonl
  cubec export default --format csv > cells.csv";

/// Cells fetched per scan page and edges per edge-list page while
/// exporting: large pages, few round trips.
const EXPORT_PAGE: u32 = 16_384;
/// Bytes buffered before stdout is written to.
const OUTPUT_BUFFER_BYTES: usize = 1024 * 1024;

#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// Namespace to export
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    ns: NamespaceName,

    /// Only this box: cells and programs inside it, edges leaving it
    #[arg(long, num_args = 2, value_parser = parse_coord, allow_hyphen_values = true,
          value_names = ["X0,Y0,Z0", "X1,Y1,Z1"])]
    region: Option<Vec<Coord>>,

    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
}

/// Why an export ended early.
enum ExportEnd {
    /// The reader of stdout went away (`| head`): not an error.
    ReaderGone,
    Failed(Failure),
}

impl From<ClientError> for ExportEnd {
    fn from(error: ClientError) -> ExportEnd {
        ExportEnd::Failed(Failure::from(error))
    }
}

/// The next page's cursor, or `None` after the last page; a cursor that
/// does not move forward is the daemon's error, and would loop for ever.
fn advance_cursor<T: PartialOrd + std::fmt::Debug + std::fmt::Display + Copy>(
    list: &str,
    after: Option<T>,
    resume_after: Option<T>,
) -> Result<Option<T>, ExportEnd> {
    match resume_after {
        Some(next) if after.is_some_and(|previous| next <= previous) => Err(
            ClientError::UnexpectedResponse(format!("{list} cursor went from {after:?} to {next}"))
                .into(),
        ),
        next => Ok(next),
    }
}

fn write_out(out: &mut impl Write, bytes: &[u8]) -> Result<(), ExportEnd> {
    out.write_all(bytes).map_err(|e| output_end(&e))
}

fn output_end(error: &io::Error) -> ExportEnd {
    if error.kind() == io::ErrorKind::BrokenPipe {
        ExportEnd::ReaderGone
    } else {
        ExportEnd::Failed(crate::output_failure(error))
    }
}

/// The cells of `region` as CSV (which holds no edges or programs).
fn export_csv(
    client: &mut Client,
    ns: &str,
    region: &CellBox,
    out: &mut impl Write,
    cells: &mut u64,
) -> Result<(), ExportEnd> {
    let mut csv = CsvWriter::new(out);
    csv.header().map_err(|e| output_end(&e))?;
    for cell in client.scan(ns, *region, EXPORT_PAGE.min(MAX_SCAN_PAGE_CELLS)) {
        let cell = cell?;
        csv.cell(cell.coord, &cell.value)
            .map_err(|e| output_end(&e))?;
        *cells += 1;
    }
    csv.flush().map_err(|e| output_end(&e))
}

pub(crate) fn export(
    client: &mut Client,
    args: &ExportArgs,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let region = match args.region.as_deref() {
        Some([lo, hi]) => CellBox::new(*lo, *hi)
            .map_err(|why| Failure::usage(format!("--region: {why}; see `cubec help export`")))?,
        _ => CellBox::new(
            Coord::new(i32::MIN, i32::MIN, i32::MIN),
            Coord::new(i32::MAX, i32::MAX, i32::MAX),
        )
        .map_err(Failure::usage)?,
    };
    let started = Instant::now();
    let mut out = BufWriter::with_capacity(OUTPUT_BUFFER_BYTES, out);
    let mut counts = (0u64, 0u64, 0u64);
    let result = export_into(client, args, &region, &mut out, &mut counts).and_then(|()| {
        out.flush()
            .map_err(|e| ExportEnd::Failed(crate::output_failure(&e)))
    });
    match result {
        Ok(()) | Err(ExportEnd::ReaderGone) => {}
        Err(ExportEnd::Failed(failure)) => return Err(failure),
    }
    let (cells, edges, programs) = counts;
    if args.format == Format::Csv && edges + programs > 0 {
        eprintln!(
            "cubec: warning: CSV holds cells only: left out {edges} edges and {programs} programs \
             of {}; export without --format csv (JSON lines) to keep them",
            args.ns
        );
    }
    if io::stderr().is_terminal() {
        let (edges, programs) = if args.format == Format::Csv {
            (0, 0)
        } else {
            (edges, programs)
        };
        eprintln!(
            "cubec: exported {cells} cells, {edges} edges, {programs} programs of {} in {:.2} s",
            args.ns,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(0)
}

fn export_into(
    client: &mut Client,
    args: &ExportArgs,
    region: &CellBox,
    out: &mut impl Write,
    (cells, edges, programs): &mut (u64, u64, u64),
) -> Result<(), ExportEnd> {
    let ns = args.ns.as_str();
    // CSV carries cells only: the edges and programs are counted, not
    // written, so `export` can say what the file leaves out.
    let write_all = args.format == Format::Jsonl;
    let mut line = String::with_capacity(4096);
    if args.format == Format::Csv {
        export_csv(client, ns, region, out, cells)?;
    } else {
        for cell in client.scan(ns, *region, EXPORT_PAGE.min(MAX_SCAN_PAGE_CELLS)) {
            let cell = cell?;
            line.clear();
            cell_line(&mut line, cell.coord, &cell.value);
            write_out(out, line.as_bytes())?;
            *cells += 1;
        }
    }
    let mut after = None;
    loop {
        let page = client.edge_page(ns, EXPORT_PAGE.min(MAX_EDGE_PAGE), after)?;
        for edge in page.edges.iter().filter(|e| region.contains(e.from)) {
            line.clear();
            edge_line(
                &mut line,
                edge.from,
                edge.to,
                edge.label.as_str(),
                edge.weight,
            );
            if write_all {
                write_out(out, line.as_bytes())?;
            }
            *edges += 1;
        }
        match advance_cursor("edge-list", after, page.resume_after)? {
            None => break,
            next => after = next,
        }
    }
    let mut after = None;
    loop {
        let page = client.program_page(ns, MAX_PROGRAM_PAGE, after)?;
        for program in page.programs.iter().filter(|p| region.contains(p.coord)) {
            line.clear();
            program_line(&mut line, program.coord, &program.source);
            if write_all {
                write_out(out, line.as_bytes())?;
            }
            *programs += 1;
        }
        match advance_cursor("prog-list", after, page.resume_after)? {
            None => break,
            next => after = next,
        }
    }
    Ok(())
}
