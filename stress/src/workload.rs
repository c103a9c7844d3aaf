//! What the client threads ask for.
//!
//! A workload turns a random stream into [`Op`]s; a target's connection
//! executes them. Adding a workload (`scan`, `walk`, `seed` come with the
//! commands they need) means: a [`WorkloadKind`] variant, its arm in
//! [`Workload::next_op`], and, for a new request type, an [`Op`] and
//! [`Command`] variant with its arm in the executor (`run::execute`) and a
//! method on `target::Connection`.

use clap::ValueEnum;
use cube_protocol::MAX_MGET_CELLS;

use crate::keyspace::KeySpace;
use crate::rng::Rng;

/// The request types the driver measures, one latency histogram each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Command {
    Put,
    Get,
    Mget,
    Link,
    Unlink,
    Walk,
    Path,
    Prog,
    Run,
    Step,
    CellStats,
}

impl Command {
    pub const ALL: [Command; 11] = [
        Command::Put,
        Command::Get,
        Command::Mget,
        Command::Link,
        Command::Unlink,
        Command::Walk,
        Command::Path,
        Command::Prog,
        Command::Run,
        Command::Step,
        Command::CellStats,
    ];

    /// The name in tables and JSON; the same as the server's `cmd.<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Command::Put => "put",
            Command::Get => "get",
            Command::Link => "link",
            Command::Unlink => "unlink",
            Command::Walk => "walk",
            Command::Path => "path",
            Command::Prog => "prog",
            Command::Run => "run",
            Command::Step => "step",
            Command::CellStats => "cell-stats",
            Command::Mget => "mget",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One request a client thread is about to make, on a key numbered in the
/// [`KeySpace`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A durable write of the next version of one of the thread's own keys.
    Put { key: u64 },
    /// A read of any key.
    Get { key: u64 },
    /// One request reading `batch` random keys, drawn by [`mget_keys`]
    /// from `draw` (so the op stays `Copy` and the keys are known again
    /// when the answer is checked).
    Mget { draw: u64, batch: u32 },
    /// A durable edge `from -> to` (weight 1) between lattice neighbours,
    /// from one of the thread's own keys.
    Link { from: u64, to: u64 },
    /// Removing such an edge.
    Unlink { from: u64, to: u64 },
    /// A walk of `walk_workload::WALK_DEPTH` hops from any key.
    Walk { key: u64 },
    /// The cheapest path between two nearby keys.
    Path { from: u64, to: u64 },
    /// Storing counter variant `variant` at counter cell `cell`.
    Prog { cell: u64, variant: u64 },
    /// Running the program of counter cell `cell`.
    Run { cell: u64 },
    /// `prog` of counter variant `variant` at counter cell `cell` and a `run`
    /// of it, pipelined in one round trip (`seed --pipeline`); timed as
    /// both a `prog` and a `run`.
    ProgRun { cell: u64, variant: u64 },
    /// One `step` over the `cells` counter cells from `first_cell` on, all in
    /// one row of the counter plane: every counter program in the box runs
    /// once.
    Step { first_cell: u64, cells: u64 },
    /// Reading counter cell `cell`'s telemetry counts.
    CellStats { cell: u64 },
}

impl Op {
    pub fn command(self) -> Command {
        match self {
            Op::Put { .. } => Command::Put,
            Op::Get { .. } => Command::Get,
            Op::Mget { .. } => Command::Mget,
            Op::Link { .. } => Command::Link,
            Op::Unlink { .. } => Command::Unlink,
            Op::Walk { .. } => Command::Walk,
            Op::Path { .. } => Command::Path,
            Op::Prog { .. } | Op::ProgRun { .. } => Command::Prog,
            Op::Run { .. } => Command::Run,
            Op::Step { .. } => Command::Step,
            Op::CellStats { .. } => Command::CellStats,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// Durable writes only, each client to its own keys.
    Put,
    /// Reads only, of any key (all keys are written once before the clock starts).
    Get,
    /// Reads with probability --read-ratio, writes otherwise.
    Mixed,
    /// Reads of --batch random keys per request, one mget (Redis MGET,
    /// one SELECT for SQLite); all keys are written once before the clock
    /// starts, as for get.
    Mget,
    /// Walks (50 %) and paths (10 %) over a lattice of edges, mixed with
    /// links (25 %) and unlinks (15 %); every key is linked to its lattice
    /// neighbours before the clock starts. cube only.
    Walk,
    /// Cell programs: prog (46.5 %) and run (46.5 %) of counter programs
    /// at many cells, step (1 %) over 8 cells of a row, cell-stats (6 %);
    /// at the end every cell's telemetry count must equal the runs
    /// acknowledged for it. cube only.
    #[value(name = "seed")]
    Programs,
    /// Durable puts on a plane while --watchers watches follow tiles of
    /// it, each checked to see exactly its tile's acknowledged writes;
    /// the writers' throughput with and without them, commit-to-delivery
    /// latency, and a `--from` replay (`watch_workload`). cube only.
    Watch,
}

impl WorkloadKind {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Put => "put",
            WorkloadKind::Get => "get",
            WorkloadKind::Mixed => "mixed",
            WorkloadKind::Mget => "mget",
            WorkloadKind::Walk => "walk",
            WorkloadKind::Programs => "seed",
            WorkloadKind::Watch => "watch",
        }
    }

    /// Whether the workload uses edges, which only cube has.
    pub fn needs_edges(self) -> bool {
        matches!(self, WorkloadKind::Walk)
    }
}

/// The default share of reads in `mixed`: 90 %, the read-mostly mix of a
/// typical cache-like service (YCSB's workload B is 95 %).
pub const DEFAULT_READ_RATIO: f64 = 0.9;

/// Keys per request of the `mget` workload unless `--batch` says otherwise.
pub const DEFAULT_MGET_BATCH: u32 = 64;

/// The most keys one `mget` request carries (the protocol's limit).
pub const MAX_MGET_BATCH: u32 = MAX_MGET_CELLS;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    pub kind: WorkloadKind,
    /// Only used by `mixed`.
    pub read_ratio: f64,
    /// Keys per request; only used by `mget`.
    pub batch: u32,
    /// `seed` only: each `prog` goes with a `run` of its cell, pipelined.
    pub pipeline: bool,
}

impl Workload {
    pub fn new(kind: WorkloadKind, read_ratio: f64) -> Result<Workload, String> {
        if !(0.0..=1.0).contains(&read_ratio) {
            return Err(format!("--read-ratio {read_ratio} is not between 0 and 1"));
        }
        Ok(Workload {
            kind,
            read_ratio,
            batch: DEFAULT_MGET_BATCH,
            pipeline: false,
        })
    }

    /// The same workload with `prog` and `run` pipelined in pairs (`seed`
    /// only).
    pub fn with_pipeline(self, pipeline: bool) -> Result<Workload, String> {
        if pipeline && self.kind != WorkloadKind::Programs {
            return Err(format!(
                "--pipeline pairs prog with run, so it needs --workload seed, not {}",
                self.kind.name()
            ));
        }
        Ok(Workload { pipeline, ..self })
    }

    /// The same workload with `batch` keys per `mget` request.
    pub fn with_batch(self, batch: u64) -> Result<Workload, String> {
        match u32::try_from(batch) {
            Ok(batch @ 1..=MAX_MGET_BATCH) => Ok(Workload { batch, ..self }),
            _ => Err(format!(
                "--batch {batch} is not between 1 and {MAX_MGET_BATCH} \
                 (the most keys one mget request carries)"
            )),
        }
    }

    pub fn name(&self) -> &'static str {
        if self.pipeline {
            "seed-pipelined"
        } else {
            self.kind.name()
        }
    }

    /// The next request of client `client`.
    pub fn next_op(&self, rng: &mut Rng, keys: &KeySpace, client: usize) -> Op {
        match self.kind {
            // `watch` runs its own writers (`watch_workload`); as ops, puts.
            WorkloadKind::Put | WorkloadKind::Watch => Op::Put {
                key: keys.random_owned_key(client, rng),
            },
            WorkloadKind::Get => Op::Get {
                key: keys.random_key(rng),
            },
            WorkloadKind::Mget => Op::Mget {
                draw: rng.next_u64(),
                batch: self.batch,
            },
            WorkloadKind::Mixed => {
                if rng.chance(self.read_ratio) {
                    Op::Get {
                        key: keys.random_key(rng),
                    }
                } else {
                    Op::Put {
                        key: keys.random_owned_key(client, rng),
                    }
                }
            }
            WorkloadKind::Walk => crate::walk_workload::next_op(rng, keys, client),
            WorkloadKind::Programs => crate::program_workload::next_op(rng, keys, self.pipeline),
        }
    }

    /// Whether every key is written once before the clock starts, so reads
    /// find values.
    pub fn needs_prefill(&self) -> bool {
        match self.kind {
            WorkloadKind::Put
            | WorkloadKind::Walk
            | WorkloadKind::Programs
            | WorkloadKind::Watch => false,
            WorkloadKind::Get | WorkloadKind::Mget => true,
            WorkloadKind::Mixed => self.read_ratio > 0.0,
        }
    }

    /// Keys read per request: `batch` for `mget`, 1 otherwise.
    pub fn cells_per_request(&self) -> u32 {
        match self.kind {
            WorkloadKind::Mget => self.batch,
            _ => 1,
        }
    }
}

/// The keys of an [`Op::Mget`]: `batch` uniform draws over the key space
/// (repeats allowed, as in any random sample of reads), the same every
/// time for the same `draw`.
pub fn mget_keys(draw: u64, batch: u32, keys: &KeySpace) -> impl Iterator<Item = u64> + '_ {
    let mut rng = Rng::new(draw);
    (0..batch).map(move |_| keys.random_key(&mut rng))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_stay_on_own_keys_and_mixed_mixes() {
        let keys = KeySpace::new(100, 4).unwrap();
        let mut rng = Rng::new(3);
        let put = Workload::new(WorkloadKind::Put, 0.5).unwrap();
        for _ in 0..200 {
            let Op::Put { key } = put.next_op(&mut rng, &keys, 2) else {
                panic!("put workload made a read");
            };
            assert_eq!(keys.owner(key), 2);
        }
        let mixed = Workload::new(WorkloadKind::Mixed, 0.9).unwrap();
        let reads = (0..2000)
            .filter(|_| matches!(mixed.next_op(&mut rng, &keys, 1), Op::Get { .. }))
            .count();
        assert!((1700..1900).contains(&reads), "{reads}");
        assert!(Workload::new(WorkloadKind::Mixed, 1.5).is_err());
    }

    #[test]
    fn mget_batches_are_bounded_and_their_keys_reproducible() {
        let keys = KeySpace::new(1000, 4).unwrap();
        let base = Workload::new(WorkloadKind::Mget, 0.9).unwrap();
        assert_eq!(base.batch, DEFAULT_MGET_BATCH);
        for bad in [0, 4097, u64::from(u32::MAX) + 1] {
            let err = base.with_batch(bad).unwrap_err();
            assert!(err.contains("between 1 and 4096"), "{err}");
        }
        let mget = base.with_batch(16).unwrap();
        assert_eq!(base.with_batch(4096).unwrap().batch, 4096);
        assert_eq!(mget.cells_per_request(), 16);
        assert!(mget.needs_prefill());
        let mut rng = Rng::new(5);
        let Op::Mget { draw, batch } = mget.next_op(&mut rng, &keys, 0) else {
            panic!("mget workload made another request");
        };
        assert_eq!(batch, 16);
        let first: Vec<u64> = mget_keys(draw, batch, &keys).collect();
        assert_eq!(first.len(), 16);
        assert!(first.iter().all(|k| *k < 1000));
        assert_eq!(first, mget_keys(draw, batch, &keys).collect::<Vec<_>>());
        assert_eq!(Op::Mget { draw, batch }.command().name(), "mget");
    }
}
