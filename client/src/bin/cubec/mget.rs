//! `cubec mget`: the values at many cells in one request, printed in the
//! order asked, one line per cell.

use std::io::{self, BufRead, Write};

use clap::Args;
use cube_client::{Client, Coord, MAX_MGET_CELLS, NamespaceName, base64, json, parse_coord};
use serde_json::json;

use super::{EXIT_NOT_FOUND, Failure, coord_json, emit, escape_value, parse_namespace_arg};

pub(crate) const MGET_HELP: &str = "\
Prints one line per coordinate, in the order given (a coordinate given twice
is printed twice): `x,y,z<TAB>value`, the value escaped exactly like `cubec
scan` prints it. An empty cell prints `x,y,z<TAB>\\N`; a stored value never
prints as `\\N`, because a backslash in a value is always written `\\\\`.
With --json, one JSON object per line:
{\"coord\":[x,y,z],\"found\":true,\"value\":...,\"value_base64\":...}
(`value` is null when the bytes are not UTF-8; both are null when the cell
is empty).

Options (--json, --socket) go before the coordinates. `-` in place of a
coordinate reads coordinates from stdin, one X,Y,Z per line (blank lines
are skipped). Up to 4096 coordinates are read in one request, from one
state of the store: no write lands between two of its cells. More are
read 4096 at a time, each batch its own state. An answer larger than
cubed's frame limit (--max-frame-bytes, 16 MiB by default) is refused: ask
for fewer cells at a time.

Exits 1 when at least one cell is empty (every cell is still printed), 3
when the namespace does not exist, like `cubec get`.

Examples:
  cubec mget default 1,2,3 -1,0,7 1,2,3
  seq 0 99 | sed 's/$/,0,0/' | cubec mget default -
  cubec --json mget default 0,0,0 0,0,1";

/// What `cubec mget` prints for an empty cell (a value never prints this).
const MISSING: &[u8] = b"\\N";

#[derive(Debug, Args)]
pub(crate) struct MgetArgs {
    /// Namespace: 1 to 64 of a-z, 0-9, '_' and '-' (a fresh server has `default`)
    #[arg(value_parser = parse_namespace_arg, value_name = "NS")]
    pub(crate) ns: NamespaceName,

    /// Cell coordinates as X,Y,Z (e.g. -1,2,3), or `-` to read them from stdin, one per line
    #[arg(
        required = true,
        num_args = 1..,
        value_parser = parse_mget_coord,
        allow_hyphen_values = true,
        value_name = "X,Y,Z"
    )]
    pub(crate) coords: Vec<CoordSource>,
}

/// One coordinate argument of `cubec mget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CoordSource {
    At(Coord),
    /// `-`: the coordinates on stdin, one per line, in their place.
    Stdin,
}

fn parse_mget_coord(text: &str) -> Result<CoordSource, String> {
    if text == "-" {
        return Ok(CoordSource::Stdin);
    }
    // The coordinates take every argument after NS (they may start with
    // `-`), so an option there arrives here.
    if text.starts_with("--") {
        return Err(format!(
            "{text} is an option, and options go before the coordinates: \
             e.g. `cubec {text} mget NS X,Y,Z ...`"
        ));
    }
    parse_coord(text).map(CoordSource::At)
}

/// The coordinates asked for, with `-` replaced by the lines of `stdin`
/// (read once, however many times `-` is given).
pub(crate) fn gather_coords(
    sources: &[CoordSource],
    stdin: impl BufRead,
) -> Result<Vec<Coord>, Failure> {
    let mut from_stdin = None;
    let mut stdin = Some(stdin);
    let mut coords = Vec::with_capacity(sources.len());
    for source in sources {
        match source {
            CoordSource::At(c) => coords.push(*c),
            CoordSource::Stdin => {
                if from_stdin.is_none() {
                    let input = stdin.take().map(read_coord_lines).transpose()?;
                    from_stdin = Some(input.unwrap_or_default());
                }
                coords.extend(from_stdin.iter().flatten().copied());
            }
        }
    }
    Ok(coords)
}

fn read_coord_lines(input: impl BufRead) -> Result<Vec<Coord>, Failure> {
    let mut coords = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| {
            Failure::usage(format!(
                "cannot read coordinates from stdin (line {}): {e}; give one X,Y,Z per line",
                i + 1
            ))
        })?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let coord = parse_coord(line).map_err(|why| {
            Failure::usage(format!(
                "stdin line {}: {why}; give one X,Y,Z per line (see `cubec help mget`)",
                i + 1
            ))
        })?;
        coords.push(coord);
    }
    Ok(coords)
}

pub(crate) fn mget(
    client: &mut Client,
    args: &MgetArgs,
    as_json: bool,
    out: &mut impl Write,
) -> Result<u8, Failure> {
    let coords = gather_coords(&args.coords, io::stdin().lock())?;
    if coords.is_empty() {
        return Err(Failure::usage(
            "no coordinates: stdin held none; give one X,Y,Z per line".to_owned(),
        ));
    }
    let values = client.mget(args.ns.as_str(), &coords)?;
    let mut missing = 0usize;
    let mut line = Vec::with_capacity(256);
    for (coord, value) in coords.iter().zip(&values) {
        missing += usize::from(value.is_none());
        line.clear();
        render_cell(*coord, value.as_deref(), as_json, &mut line);
        emit(out, &line)?;
    }
    if missing > 0 {
        eprintln!(
            "cubec: {missing} of {} cells in {} are empty",
            coords.len(),
            args.ns
        );
        return Ok(EXIT_NOT_FOUND);
    }
    Ok(0)
}

/// One output line (with its newline) for the cell at `coord`.
pub(crate) fn render_cell(coord: Coord, value: Option<&[u8]>, as_json: bool, line: &mut Vec<u8>) {
    if as_json {
        let object = match value {
            Some(bytes) => json!({
                "coord": coord_json(coord),
                "found": true,
                "value": std::str::from_utf8(bytes).ok(),
                "value_base64": base64::encode(bytes),
            }),
            None => json!({
                "coord": coord_json(coord),
                "found": false,
                "value": null,
                "value_base64": null,
            }),
        };
        let text = json::to_string(&object);
        line.extend_from_slice(text.as_bytes());
    } else {
        line.extend_from_slice(format!("{coord}\t").as_bytes());
        match value {
            Some(bytes) => escape_value(bytes, line),
            None => line.extend_from_slice(MISSING),
        }
    }
    line.push(b'\n');
}

/// Keeps the help's "4096" true.
const _: () = assert!(MAX_MGET_CELLS == 4096);

#[cfg(test)]
mod tests {
    use clap::Parser;
    use clap::error::ErrorKind;

    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cubec").chain(args.iter().copied()))
    }

    fn gathered(sources: &[CoordSource], stdin: &[u8]) -> Vec<Coord> {
        match gather_coords(sources, stdin) {
            Ok(coords) => coords,
            Err(failure) => panic!("{}", failure.message),
        }
    }

    fn mget_args(args: &[&str]) -> MgetArgs {
        match parse(args).unwrap().command {
            Command::Mget(args) => args,
            other => panic!("not mget: {other:?}"),
        }
    }

    #[test]
    fn coordinates_may_be_negative_repeated_and_mixed_with_stdin() {
        let args = mget_args(&["mget", "default", "-1,-2,-3", "4,5,6", "-", "-1,-2,-3"]);
        assert_eq!(args.ns.as_str(), "default");
        assert_eq!(
            args.coords,
            vec![
                CoordSource::At(Coord::new(-1, -2, -3)),
                CoordSource::At(Coord::new(4, 5, 6)),
                CoordSource::Stdin,
                CoordSource::At(Coord::new(-1, -2, -3)),
            ]
        );
        let stdin = b"7,8,9\n\n  -1, 0 ,2 \n".as_slice();
        assert_eq!(
            gathered(&args.coords, stdin),
            vec![
                Coord::new(-1, -2, -3),
                Coord::new(4, 5, 6),
                Coord::new(7, 8, 9),
                Coord::new(-1, 0, 2),
                Coord::new(-1, -2, -3),
            ]
        );
    }

    #[test]
    fn options_go_before_the_coordinates() {
        for args in [
            &["--json", "--socket", "/x.sock", "mget", "default", "1,2,3"][..],
            &["mget", "--json", "--socket", "/x.sock", "default", "1,2,3"],
        ] {
            let cli = parse(args).unwrap();
            assert!(cli.json);
            assert_eq!(cli.socket, std::path::PathBuf::from("/x.sock"));
            let Command::Mget(args) = cli.command else {
                panic!("not mget")
            };
            assert_eq!(args.coords, vec![CoordSource::At(Coord::new(1, 2, 3))]);
        }
        // After them an option is taken for a coordinate: say what to do.
        let err = parse(&["mget", "default", "1,2,3", "--json"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(
            err.to_string()
                .contains("options go before the coordinates"),
            "{err}"
        );
    }

    #[test]
    fn missing_or_bad_coordinates_are_usage_errors() {
        let err = parse(&["mget", "default"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        let err = parse(&["mget", "default", "1,2,3", "1,2"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("X,Y,Z"), "{err}");
        let err = parse(&["mget", "Not-Valid", "1,2,3"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        let bad_line = gather_coords(&[CoordSource::Stdin], b"1,2,3\nnope\n".as_slice())
            .err()
            .unwrap();
        assert_eq!(bad_line.code, super::super::EXIT_USAGE);
        assert!(
            bad_line.message.contains("stdin line 2"),
            "{}",
            bad_line.message
        );
    }

    #[test]
    fn stdin_is_read_once_even_if_dash_is_given_twice() {
        let sources = [CoordSource::Stdin, CoordSource::Stdin];
        assert_eq!(
            gathered(&sources, b"1,1,1\n".as_slice()),
            vec![Coord::new(1, 1, 1), Coord::new(1, 1, 1)]
        );
    }

    #[test]
    fn cells_render_as_text_and_json() {
        let render = |value: Option<&[u8]>, as_json: bool| {
            let mut line = Vec::new();
            render_cell(Coord::new(1, -2, 3), value, as_json, &mut line);
            String::from_utf8(line).unwrap()
        };
        assert_eq!(render(Some(b"a\tb\\"), false), "1,-2,3\ta\\tb\\\\\n");
        assert_eq!(render(Some(b"\xff"), false), "1,-2,3\t\\xff\n");
        assert_eq!(render(Some(b""), false), "1,-2,3\t\n");
        assert_eq!(render(None, false), "1,-2,3\t\\N\n");
        // A value that reads `\N` is escaped, so it never looks missing.
        assert_eq!(render(Some(b"\\N"), false), "1,-2,3\t\\\\N\n");
        assert_eq!(
            render(Some(b"hi"), true),
            "{\"coord\":[1,-2,3],\"found\":true,\"value\":\"hi\",\"value_base64\":\"aGk=\"}\n"
        );
        assert_eq!(
            render(Some(b"\xff"), true),
            "{\"coord\":[1,-2,3],\"found\":true,\"value\":null,\"value_base64\":\"/w==\"}\n"
        );
        assert_eq!(
            render(None, true),
            "{\"coord\":[1,-2,3],\"found\":false,\"value\":null,\"value_base64\":null}\n"
        );
    }

    #[test]
    fn help_has_examples_and_the_missing_marker() {
        use clap::CommandFactory;
        let help = Cli::command()
            .find_subcommand_mut("mget")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("cubec mget default"), "{help}");
        assert!(help.contains("\\N"), "{help}");
        assert!(help.contains("stdin"), "{help}");
    }
}
