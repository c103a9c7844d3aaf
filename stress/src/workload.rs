//! What the client threads ask for.
//!
//! A workload turns a random stream into [`Op`]s; a target's connection
//! executes them. Adding a workload (`scan`, `walk`, `seed` come with the
//! commands they need) means: a [`WorkloadKind`] variant, its arm in
//! [`Workload::next_op`], and, for a new request type, an [`Op`] and
//! [`Command`] variant with its arm in the executor (`run::execute`) and a
//! method on `target::Connection`.

use clap::ValueEnum;

use crate::keyspace::KeySpace;
use crate::rng::Rng;

/// The request types the driver measures, one latency histogram each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Command {
    Put,
    Get,
}

impl Command {
    pub const ALL: [Command; 2] = [Command::Put, Command::Get];

    /// The name in tables and JSON; the same as the server's `cmd.<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Command::Put => "put",
            Command::Get => "get",
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
}

impl Op {
    pub fn command(self) -> Command {
        match self {
            Op::Put { .. } => Command::Put,
            Op::Get { .. } => Command::Get,
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
}

impl WorkloadKind {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Put => "put",
            WorkloadKind::Get => "get",
            WorkloadKind::Mixed => "mixed",
        }
    }
}

/// The default share of reads in `mixed`: 90 %, the read-mostly mix of a
/// typical cache-like service (YCSB's workload B is 95 %).
pub const DEFAULT_READ_RATIO: f64 = 0.9;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    pub kind: WorkloadKind,
    /// Only used by `mixed`.
    pub read_ratio: f64,
}

impl Workload {
    pub fn new(kind: WorkloadKind, read_ratio: f64) -> Result<Workload, String> {
        if !(0.0..=1.0).contains(&read_ratio) {
            return Err(format!("--read-ratio {read_ratio} is not between 0 and 1"));
        }
        Ok(Workload { kind, read_ratio })
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The next request of client `client`.
    pub fn next_op(&self, rng: &mut Rng, keys: &KeySpace, client: usize) -> Op {
        match self.kind {
            WorkloadKind::Put => Op::Put {
                key: keys.random_owned_key(client, rng),
            },
            WorkloadKind::Get => Op::Get {
                key: keys.random_key(rng),
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
        }
    }

    /// Whether every key is written once before the clock starts, so reads
    /// find values.
    pub fn needs_prefill(&self) -> bool {
        match self.kind {
            WorkloadKind::Put => false,
            WorkloadKind::Get => true,
            WorkloadKind::Mixed => self.read_ratio > 0.0,
        }
    }
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
}
