//! The crash torture's watcher (`cube-stress crash`, `make crash`): a
//! `watch` follows client 0's box through every kill, and what it was told
//! is checked against what the clients were told.
//!
//! During each cycle a thread follows the box (client 0's keys, its
//! program plane and one sync cell past its keys) live, resuming `--from`
//! one past the last LSN it saw; the kill ends its connection. After each
//! restart and read-back the checker writes the sync cell (its LSN `S` is
//! the end of everything before it), resumes the watch again, reads up to
//! `S`, and checks:
//! - LSNs only rise across every resume (no change twice, none out of
//!   order, none repeated at a seam), and no change is outside the box;
//! - every acknowledged put of client 0 came, at its LSN, with its
//!   coordinate and value (so none was missed at a seam);
//! - the state the changes build (values, edges, the program) is the
//!   state the read-back found (so no delete, edge or program change was
//!   missed either).
//!
//! When the history the watch needs is gone (a fold removed its segments;
//! a clean shutdown folds everything) the watch answers `resync`: the
//! checker takes the read-back state as the snapshot (no write happens
//! between the read-back and `S`), watches on from `S`, and counts it; the
//! acknowledged puts before the snapshot are then covered by the read-back.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cube_client::{CellBox, Client, ClientError, Coord, ResyncReason, WatchOp};

use super::{
    ClientState, NAMESPACE, PROGRAM_CELLS, PROGRAM_Z, Violation, connect, is_disconnect,
    variant_of_length,
};

/// The client whose box is watched.
pub(super) const WATCHED_CLIENT: usize = 0;

/// How long a watch waits for its next change before the run counts it
/// as wedged (only a hang trips it: the sync write always comes).
const WATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// The value written to the sync cell.
const SYNC_VALUE: &[u8] = b"crash-watch-sync";

/// What the watcher saw and how the checks went, for the report.
#[derive(Clone, Debug, Default)]
pub struct WatchFigures {
    pub changes: u64,
    pub groups: u64,
    /// Watches started again `--from` the LSN after the last one seen.
    pub resumes: u64,
    pub resyncs_history_gone: u64,
    pub resyncs_too_slow: u64,
    /// Acknowledged puts found delivered at their LSN.
    pub puts_checked: u64,
    /// Acknowledged puts before a resync's snapshot (covered by it).
    pub puts_snapshotted: u64,
    /// Syncs whose rebuilt state matched the read-back.
    pub states_matched: u64,
}

/// The watcher's state across cycles.
pub(super) struct Watcher {
    region: CellBox,
    sync: Coord,
    keys: u32,
    /// The LSN to watch from next; 0 before the first sync.
    next_lsn: u64,
    /// The state the delivered changes built.
    model: ClientState,
    /// Puts delivered since the last sync: LSN to (coordinate, value).
    delivered_puts: BTreeMap<u64, (Coord, Vec<u8>)>,
    /// Acknowledged puts before this LSN are covered by a snapshot.
    snapshot_lsn: u64,
    pub figures: WatchFigures,
    pub problems: Vec<Violation>,
}

/// Why following stopped.
enum Stop {
    /// The change at the target LSN came.
    Reached,
    /// The connection ended (a kill, a shutdown).
    Ended,
    /// The history needed is gone.
    HistoryGone,
}

impl Watcher {
    pub(super) fn new(keys: u32) -> Watcher {
        let far = keys.max(PROGRAM_CELLS) as i32;
        let x = WATCHED_CLIENT as i32;
        let region = CellBox::new(Coord::new(x, 0, 0), Coord::new(x, far, PROGRAM_Z))
            .expect("the watched box's corners are ordered");
        Watcher {
            region,
            sync: Coord::new(x, far, 0),
            keys,
            next_lsn: 0,
            model: ClientState::default(),
            delivered_puts: BTreeMap::new(),
            snapshot_lsn: 0,
            figures: WatchFigures::default(),
            problems: Vec::new(),
        }
    }

    fn problem(&mut self, cycle: usize, what: String, expected: String, found: String) {
        self.problems.push(Violation {
            cycle,
            client: Some(WATCHED_CLIENT),
            coord: None,
            what: format!("watch: {what}"),
            expected,
            found,
        });
    }

    /// Follows the box live until the daemon goes away (the cycle's kill).
    /// Before the first sync there is nothing to resume from.
    pub(super) fn follow_live(&mut self, socket: &Path, cycle: usize) {
        if self.next_lsn == 0 {
            return;
        }
        match self.follow(socket, cycle, None) {
            Ok(_) => {}
            // Cut off before or while the watch started: the kill.
            Err(e) if is_disconnect(&e) => {}
            Err(e) if e.server_code() == Some(cube_client::ErrorCode::ShuttingDown) => {}
            Err(e) => self.problem(
                cycle,
                format!("the live watch failed: {e}"),
                String::new(),
                String::new(),
            ),
        }
    }

    /// After a restart and read-back: writes the sync cell, catches the
    /// watch up to it and checks everything since the last sync against
    /// `found` (client 0's state as read back) and `acked_puts` (client
    /// 0's acknowledged puts: LSN, key, value).
    pub(super) fn sync(
        &mut self,
        conn: &mut Client,
        socket: &Path,
        cycle: usize,
        found: &ClientState,
        acked_puts: &[(u64, u32, Vec<u8>)],
    ) -> Result<(), ClientError> {
        let sync_lsn = conn.put(NAMESPACE, self.sync, SYNC_VALUE)?;
        if self.next_lsn == 0 {
            // The first sync: the box was empty before the first cycle's
            // writes, and the read-back is the snapshot.
            self.snapshot(found, sync_lsn);
        }
        loop {
            match self.follow(socket, cycle, Some(sync_lsn))? {
                Stop::Reached => break,
                Stop::HistoryGone => {
                    self.figures.resyncs_history_gone += 1;
                    self.snapshot(found, sync_lsn);
                }
                Stop::Ended => {
                    self.problem(
                        cycle,
                        format!("the watch ended before the sync write (LSN {sync_lsn}) came"),
                        String::new(),
                        String::new(),
                    );
                    return Ok(());
                }
            }
        }
        self.check_puts(cycle, acked_puts);
        self.check_state(cycle, found);
        self.delivered_puts.clear();
        conn.del(NAMESPACE, self.sync)?;
        Ok(())
    }

    /// Takes `found` as the box's state up to `sync_lsn` (exclusive) and
    /// watches on from there.
    fn snapshot(&mut self, found: &ClientState, sync_lsn: u64) {
        self.model = ClientState {
            cells: found.cells.clone(),
            edges: found.edges.clone(),
            prog_cells: found.prog_cells.clone(),
            program: found.program,
            ..ClientState::default()
        };
        self.delivered_puts.clear();
        self.snapshot_lsn = sync_lsn;
        self.next_lsn = sync_lsn;
    }

    /// Watches `--from` the next LSN until `until`'s change comes (or,
    /// without `until`, until the connection ends).
    fn follow(
        &mut self,
        socket: &Path,
        cycle: usize,
        until: Option<u64>,
    ) -> Result<Stop, ClientError> {
        let client = connect(socket)?;
        let mut watch = client.watch(NAMESPACE, self.region, Some(self.next_lsn))?;
        watch.set_timeout(Some(WATCH_TIMEOUT))?;
        self.figures.resumes += 1;
        if watch.start_lsn() != self.next_lsn {
            self.problem(
                cycle,
                "the watch started elsewhere than asked".into(),
                format!("from LSN {}", self.next_lsn),
                format!("from LSN {}", watch.start_lsn()),
            );
        }
        for group in watch.by_ref() {
            let group = match group {
                Ok(group) => group,
                Err(ClientError::Resync { lsn, reason }) => match reason {
                    ResyncReason::HistoryGone => return Ok(Stop::HistoryGone),
                    ResyncReason::TooSlow => {
                        self.figures.resyncs_too_slow += 1;
                        self.next_lsn = self.next_lsn.max(lsn);
                        return self.follow(socket, cycle, until);
                    }
                },
                Err(e) if is_disconnect(&e) => return Ok(Stop::Ended),
                Err(e) if e.server_code() == Some(cube_client::ErrorCode::ShuttingDown) => {
                    return Ok(Stop::Ended);
                }
                Err(e) => return Err(e),
            };
            self.figures.groups += 1;
            let mut reached = false;
            // Every change of this group comes after everything seen
            // before it; inside it LSNs rise, a detach's changes sharing one.
            let mut floor = self.next_lsn;
            for change in group.changes {
                reached |= Some(change.lsn) == until && change.coord == self.sync;
                self.take(cycle, floor, change.lsn, change.coord, change.op);
                floor = floor.max(change.lsn);
            }
            if reached {
                return Ok(Stop::Reached);
            }
        }
        Ok(Stop::Ended)
    }

    /// One delivered change, which must be at `floor` or later: checked
    /// for order and place, applied.
    fn take(&mut self, cycle: usize, floor: u64, lsn: u64, at: Coord, op: WatchOp) {
        self.figures.changes += 1;
        if lsn < floor {
            self.problem(
                cycle,
                format!("LSN {lsn} at {at} came again or out of order"),
                format!("LSN {floor} or later"),
                format!("{} at LSN {lsn}", op.name()),
            );
        }
        if !self.region.contains(at) {
            self.problem(
                cycle,
                format!(
                    "a change outside the box {} came: {} at {at}",
                    self.region,
                    op.name()
                ),
                String::new(),
                String::new(),
            );
            return;
        }
        self.next_lsn = self.next_lsn.max(lsn + 1);
        if at == self.sync {
            return;
        }
        let key = (at.z == 0).then_some(at.y as u32);
        match (op, key) {
            (WatchOp::Put(value), Some(key)) => {
                self.delivered_puts.insert(lsn, (at, value.clone()));
                self.model.cells.insert(key, value);
            }
            (WatchOp::Put(value), None) => {
                self.model.prog_cells.insert(at.y as u32, value);
            }
            (WatchOp::Del, Some(key)) => {
                self.model.cells.remove(&key);
            }
            (WatchOp::Del, None) => {
                self.model.prog_cells.remove(&(at.y as u32));
            }
            (WatchOp::Link { to, weight, .. }, Some(key)) => {
                self.model.edges.insert((key, to.y as u32), weight);
            }
            (WatchOp::Unlink { to, .. }, Some(key)) => {
                self.model.edges.remove(&(key, to.y as u32));
            }
            (WatchOp::ProgramPut(source), _) => {
                self.model.program = variant_of_length(source.len() as u32);
            }
            (WatchOp::ProgramDel, _) => self.model.program = None,
            (op, None) => self.problem(
                cycle,
                format!("an edge change {} on the program plane at {at}", op.name()),
                String::new(),
                String::new(),
            ),
        }
    }

    /// Every acknowledged put since the last sync came at its LSN.
    fn check_puts(&mut self, cycle: usize, acked_puts: &[(u64, u32, Vec<u8>)]) {
        for (lsn, key, value) in acked_puts {
            if *lsn < self.snapshot_lsn {
                self.figures.puts_snapshotted += 1;
                continue;
            }
            let at = Coord::new(WATCHED_CLIENT as i32, *key as i32, 0);
            match self.delivered_puts.get(lsn) {
                Some((coord, got)) if *coord == at && got == value => {
                    self.figures.puts_checked += 1;
                }
                other => {
                    let found = match other {
                        Some((coord, got)) => format!("{coord}, {} bytes", got.len()),
                        None => "nothing at that LSN".into(),
                    };
                    self.problem(
                        cycle,
                        format!("the acknowledged put at LSN {lsn} did not come as written"),
                        format!("put {at}, {} bytes", value.len()),
                        found,
                    );
                }
            }
        }
    }

    /// The state the changes built is the state read back.
    fn check_state(&mut self, cycle: usize, found: &ClientState) {
        let same = self.model.cells == found.cells
            && self.model.edges == found.edges
            && self.model.prog_cells == found.prog_cells
            && self.model.program == found.program;
        if same {
            self.figures.states_matched += 1;
            return;
        }
        let keys = self.keys;
        let differing: Vec<u32> = (0..keys)
            .filter(|k| self.model.cells.get(k) != found.cells.get(k))
            .take(8)
            .collect();
        let what = "the changes delivered do not add up to the state read back".to_owned();
        let expected = format!(
            "{} values, {} edges, {} program cells, program {:?}",
            found.cells.len(),
            found.edges.len(),
            found.prog_cells.len(),
            found.program
        );
        let got = format!(
            "{} values, {} edges, {} program cells, program {:?}; keys differing: {differing:?}",
            self.model.cells.len(),
            self.model.edges.len(),
            self.model.prog_cells.len(),
            self.model.program
        );
        self.problem(cycle, what, expected, got);
        // Carry on from the truth, so one miss is reported once.
        self.snapshot(found, self.next_lsn);
    }
}
