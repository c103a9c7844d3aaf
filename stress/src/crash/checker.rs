//! Reading every client's state back after a restart and judging it
//! against the client's model (the acknowledged state, or it plus the
//! operation in flight).

use super::*;

/// Reads client `id`'s whole state back. Anything that is not one of its
/// own edges with the torture's label is a violation (returned as text).
pub(super) fn read_state(
    conn: &mut Client,
    id: usize,
    args: &CrashArgs,
) -> Result<(ClientState, Vec<String>), ClientError> {
    let (keys, with_edges) = (args.keys, !args.no_edges);
    let mut state = ClientState::default();
    let mut strays = Vec::new();
    if !args.no_programs {
        read_program_plane(conn, id, &mut state, &mut strays)?;
    }
    let region =
        CellBox::new(coord(id, 0), coord(id, keys - 1)).map_err(ClientError::BadArgument)?;
    for cell in conn.scan(NAMESPACE, region, SCAN_PAGE_CELLS) {
        let cell = cell?;
        match owned_key(id, keys, cell.coord) {
            Some(key) => {
                if state.cells.insert(key, cell.value).is_some() {
                    strays.push(format!("{} came twice in one scan", cell.coord));
                }
            }
            None => strays.push(format!("scan of the client's box returned {}", cell.coord)),
        }
    }
    if !with_edges {
        return Ok((state, strays));
    }
    // Outgoing edges make the state; incoming ones must mirror them.
    let mut incoming = BTreeMap::new();
    for key in 0..keys {
        let at = coord(id, key);
        for edge in conn.edges(NAMESPACE, at, Direction::Both, None)? {
            let other = owned_key(id, keys, edge.other);
            match (edge.direction, other) {
                (_, None) => strays.push(format!(
                    "{at} has a {:?} edge with {}, outside the client's keys",
                    edge.direction, edge.other
                )),
                _ if edge.label.as_str() != LABEL => strays.push(format!(
                    "{at} has an edge labelled {:?}, never written",
                    edge.label.as_str()
                )),
                (Direction::Out, Some(to)) => {
                    state.edges.insert((key, to), edge.weight);
                }
                (_, Some(from)) => {
                    incoming.insert((from, key), edge.weight);
                }
            }
        }
    }
    if incoming != state.edges {
        let out_only: Vec<_> = state
            .edges
            .keys()
            .filter(|e| !incoming.contains_key(e))
            .collect();
        let in_only: Vec<_> = incoming
            .keys()
            .filter(|e| !state.edges.contains_key(e))
            .collect();
        strays.push(format!(
            "incoming and outgoing edge indexes disagree: only outgoing {out_only:?}, only incoming {in_only:?} \
             (key indexes), or weights differ"
        ));
    }
    Ok((state, strays))
}

/// Reads client `id`'s program plane: its cells, which program variant is
/// stored, and the program cell's telemetry counts.
pub(super) fn read_program_plane(
    conn: &mut Client,
    id: usize,
    state: &mut ClientState,
    strays: &mut Vec<String>,
) -> Result<(), ClientError> {
    let at = program_coord(id);
    let plane = CellBox::new(
        at,
        Coord::new(id as i32, PROGRAM_CELLS as i32 - 1, PROGRAM_Z),
    )
    .map_err(ClientError::BadArgument)?;
    for cell in conn.scan(NAMESPACE, plane, SCAN_PAGE_CELLS) {
        let cell = cell?;
        match owned_program_cell(id, cell.coord) {
            Some(i) => {
                if state.prog_cells.insert(i, cell.value).is_some() {
                    strays.push(format!("{} came twice in one scan", cell.coord));
                }
            }
            None => strays.push(format!(
                "scan of the client's program plane returned {}",
                cell.coord
            )),
        }
    }
    let stats = conn.cell_stats(NAMESPACE, at, 1)?;
    state.program = match stats.program_bytes {
        None => None,
        Some(bytes) => match variant_of_length(bytes) {
            Some(variant) => Some(variant),
            None => {
                strays.push(format!(
                    "{at} holds a program of {bytes} bytes, which is no variant's length"
                ));
                None
            }
        },
    };
    state.runs = stats.runs;
    state.failures = stats.failures;
    if let Some(newest) = stats.records.last()
        && newest.seq != stats.runs
    {
        strays.push(format!(
            "{at}: the newest telemetry record is run {} but the count is {}",
            newest.seq, stats.runs
        ));
    }
    Ok(())
}

pub(super) fn count_figure(figures: &[StatsEntry], name: &str) -> Option<u64> {
    figures.iter().find_map(|entry| match entry.value {
        StatsValue::Count(n) if entry.name == name => Some(n),
        _ => None,
    })
}

/// Restarts the daemon and compares every client's state with its model.
/// Returns false when the daemon would not come back (a violation).
pub(super) fn restart_and_verify(
    daemon: &mut LocalDaemon,
    clients: &mut [ClientRun],
    args: &CrashArgs,
    cycle: usize,
    report: &mut TortureReport,
) -> bool {
    let restart_started = Instant::now();
    if let Err(e) = daemon.restart() {
        report.violations.push(Violation {
            cycle,
            client: None,
            coord: None,
            what: "cubed did not come back on its own data".to_owned(),
            expected: "a successful restart".to_owned(),
            found: e.to_string(),
        });
        return false;
    }
    report
        .restart_ms
        .push(restart_started.elapsed().as_secs_f64() * 1000.0);
    let outcome = read_back(daemon.socket(), clients, args, cycle, report);
    if let Err(e) = outcome {
        report.violations.push(Violation {
            cycle,
            client: None,
            coord: None,
            what: format!("reading back after the restart failed: {e}"),
            expected: String::new(),
            found: String::new(),
        });
    }
    true
}

/// After a restart: reads every client's state back and judges it, then
/// checks that no cell exists outside the clients' keys.
fn read_back(
    socket: &Path,
    clients: &mut [ClientRun],
    args: &CrashArgs,
    cycle: usize,
    report: &mut TortureReport,
) -> Result<(), ClientError> {
    let mut conn = connect(socket)?;
    let figures = conn.stats()?;
    report.note_recovery(&figures);
    let mut present = 0u64;
    for client in clients.iter_mut() {
        let (found, strays) = read_state(&mut conn, client.id, args)?;
        report.keys_verified += u64::from(args.keys);
        if !args.no_edges {
            report.edge_lists_verified += u64::from(args.keys);
        }
        if !args.no_programs {
            report.program_planes_verified += 1;
        }
        present += (found.cells.len() + found.prog_cells.len()) as u64;
        for stray in strays {
            report.violations.push(Violation {
                cycle,
                client: Some(client.id),
                coord: None,
                what: stray,
                expected: String::new(),
                found: String::new(),
            });
        }
        judge(client, found, cycle, report);
    }
    let everything = CellBox::new(
        Coord::new(i32::MIN, i32::MIN, i32::MIN),
        Coord::new(i32::MAX, i32::MAX, i32::MAX),
    )
    .map_err(ClientError::BadArgument)?;
    let total = conn.scan_count(NAMESPACE, &everything)?;
    if total != present {
        report.violations.push(Violation {
            cycle,
            client: None,
            coord: None,
            what: "cells exist outside the clients' keys".to_owned(),
            expected: format!("{present} cells in the namespace"),
            found: format!("{total} cells"),
        });
    }
    Ok(())
}

/// Compares what was found with the two states the client allows, and
/// adopts what was found as the truth for the next cycle.
pub(super) fn judge(
    client: &mut ClientRun,
    found: ClientState,
    cycle: usize,
    report: &mut TortureReport,
) {
    let in_flight = client.in_flight.take();
    let landed_state = in_flight.as_ref().map(|op| {
        let mut state = client.acked.clone();
        op.apply(&mut state);
        state
    });
    let run_in_flight = matches!(in_flight, Some(Op::Run { .. } | Op::Step { .. }));
    if found == client.acked {
        if in_flight.is_some() {
            report.in_flight_lost += 1;
            report.in_flight_runs_lost += u64::from(run_in_flight);
        }
    } else if landed_state.as_ref() == Some(&found) {
        report.in_flight_landed += 1;
        report.in_flight_runs_landed += u64::from(run_in_flight);
    } else {
        let diffs = differences(client.id, &client.acked, &found);
        let mut expected = format!(
            "the acknowledged state ({} values, {} edges, {} program runs)",
            client.acked.cells.len(),
            client.acked.edges.len(),
            client.acked.runs
        );
        if let Some(op) = &in_flight {
            let _ = write!(
                expected,
                ", or it plus the in-flight `{}`",
                op.describe(client.id)
            );
        }
        let shown: Vec<&str> = diffs
            .iter()
            .take(SHOWN_DIFFERENCES)
            .map(String::as_str)
            .collect();
        report.violations.push(Violation {
            cycle,
            client: Some(client.id),
            coord: None,
            what: "state after restart is neither the acknowledged one nor it plus the in-flight operation".to_owned(),
            expected,
            found: format!(
                "{} difference(s) from the acknowledged state: {}{}",
                diffs.len(),
                shown.join("; "),
                if diffs.len() > shown.len() { "; ..." } else { "" }
            ),
        });
    }
    client.acked = found;
    for (name, n) in std::mem::take(&mut client.counts) {
        *report.acked.entry(name).or_default() += n;
    }
    report.reads_checked += std::mem::take(&mut client.reads_checked);
    report.client_checkpoints += std::mem::take(&mut client.checkpoints);
    report.client_compactions += std::mem::take(&mut client.compactions);
    report.refused_shutting_down += std::mem::take(&mut client.refused_shutting_down);
}

/// The differences between two states of one client, for a violation.
pub(super) fn differences(
    client: usize,
    expected: &ClientState,
    found: &ClientState,
) -> Vec<String> {
    let mut out = Vec::new();
    for (key, e, f) in differing(&expected.cells, &found.cells) {
        out.push(format!(
            "{}: value {} instead of {}",
            coord(client, key),
            show_cell(f),
            show_cell(e)
        ));
    }
    for (cell, e, f) in differing(&expected.prog_cells, &found.prog_cells) {
        out.push(format!(
            "program plane {}: value {} instead of {}",
            Coord::new(client as i32, cell as i32, PROGRAM_Z),
            show_cell(f),
            show_cell(e)
        ));
    }
    if expected.program != found.program {
        let show = |p: Option<u8>| p.map_or_else(|| "none".to_owned(), |v| format!("variant {v}"));
        out.push(format!(
            "program at {}: {} instead of {}",
            program_coord(client),
            show(found.program),
            show(expected.program)
        ));
    }
    if (expected.runs, expected.failures) != (found.runs, found.failures) {
        out.push(format!(
            "telemetry at {}: {} runs, {} failed instead of {} runs, {} failed",
            program_coord(client),
            found.runs,
            found.failures,
            expected.runs,
            expected.failures
        ));
    }
    let show = |w: Option<&f64>| w.map_or_else(|| "absent".to_owned(), |w| format!("weight {w}"));
    for ((from, to), e, f) in differing(&expected.edges, &found.edges) {
        out.push(format!(
            "edge {} -> {}: {} instead of {}",
            coord(client, from),
            coord(client, to),
            show(f),
            show(e)
        ));
    }
    out
}

/// Every key whose value differs between two maps (present in one only
/// counts), in key order, with its value in each.
fn differing<'m, K: Ord + Copy, V: PartialEq>(
    expected: &'m BTreeMap<K, V>,
    found: &'m BTreeMap<K, V>,
) -> Vec<(K, Option<&'m V>, Option<&'m V>)> {
    let keys: std::collections::BTreeSet<K> =
        expected.keys().chain(found.keys()).copied().collect();
    keys.into_iter()
        .map(|key| (key, expected.get(&key), found.get(&key)))
        .filter(|(_, e, f)| e != f)
        .collect()
}
