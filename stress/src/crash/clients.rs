//! The client threads of the torture: each runs its own operation stream
//! and keeps the model of what its acknowledged operations made true.

use super::*;

/// One client across cycles: its model, and its operation stream.
pub(super) struct ClientRun {
    pub(super) id: usize,
    pub(super) keys: u32,
    pub(super) edges: bool,
    pub(super) programs: bool,
    pub(super) max_value_bytes: usize,
    pub(super) rng: Rng,
    pub(super) seq: u64,
    /// What its acknowledged operations made true.
    pub(super) acked: ClientState,
    /// The operation sent but not answered when the daemon went away.
    pub(super) in_flight: Option<Op>,
    /// Its box is watched (`crash_watch`): its acknowledged puts since the
    /// last sync are kept, LSN, key and value.
    pub(super) watched: bool,
    pub(super) acked_puts: Vec<(u64, u32, Vec<u8>)>,
    pub(super) counts: BTreeMap<&'static str, u64>,
    pub(super) checkpoints: u64,
    pub(super) compactions: u64,
    pub(super) reads_checked: u64,
    pub(super) refused_shutting_down: u64,
    pub(super) problems: Vec<Violation>,
}

/// What the driver's threads share during one cycle.
pub(super) struct CycleShared<'a> {
    pub(super) socket: &'a Path,
    pub(super) cycle: usize,
    pub(super) stop: &'a AtomicBool,
    pub(super) acked: &'a AtomicU64,
}

/// The connection is gone: whatever was in flight may or may not have
/// landed.
pub(crate) fn is_disconnect(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Connect { .. }
            | ClientError::Io(_)
            | ClientError::Protocol(ProtocolError::Closed | ProtocolError::TruncatedFrame { .. })
    )
}

/// What the next step of a client is.
pub(super) enum Step {
    Mutate(Op),
    Get(u32),
    Checkpoint { compact: bool },
}

impl ClientRun {
    pub(super) fn new(id: usize, args: &CrashArgs) -> ClientRun {
        ClientRun {
            id,
            keys: args.keys,
            edges: !args.no_edges,
            programs: !args.no_programs,
            max_value_bytes: args.max_value_bytes,
            rng: Rng::for_stream(args.seed, id as u64 + 1),
            seq: 0,
            acked: ClientState::default(),
            in_flight: None,
            watched: !args.no_watch && id == WATCHED_CLIENT,
            acked_puts: Vec::new(),
            counts: BTreeMap::new(),
            checkpoints: 0,
            compactions: 0,
            reads_checked: 0,
            refused_shutting_down: 0,
            problems: Vec::new(),
        }
    }

    pub(super) fn problem(
        &mut self,
        cycle: usize,
        coord: Option<Coord>,
        what: String,
        expected: String,
        found: String,
    ) {
        self.problems.push(Violation {
            cycle,
            client: Some(self.id),
            coord,
            what,
            expected,
            found,
        });
    }

    /// The next step. Checkpoints are rare (each one closes the segment
    /// and folds): 3 in 1000 steps. With edges: 5.7 % reads, then of the
    /// rest about 41 % puts, 16 % deletes, 27 % links, 12 % unlinks, 4 %
    /// detaches; without, 84 % puts and 16 % deletes. With programs, a
    /// tenth of those mutations are program steps instead.
    pub(super) fn next_step(&mut self, cycle: usize) -> Step {
        self.seq += 1;
        let key = self.rng.below(u64::from(self.keys)) as u32;
        let roll = self.rng.below(1000);
        if roll >= 60 && self.programs && self.rng.below(10) == 0 {
            return Step::Mutate(self.program_step());
        }
        let mutation_roll = if self.edges { roll } else { roll % 600 };
        match (roll, mutation_roll) {
            (0..3, _) => Step::Checkpoint {
                compact: self.rng.below(3) == 0,
            },
            (3..60, _) => Step::Get(key),
            (_, 0..450) => {
                // Mostly small values, now and then a large one, so that
                // segments fill and roll quickly.
                let len = if self.rng.below(10) == 0 {
                    self.max_value_bytes
                } else {
                    MIN_VALUE_BYTES + self.rng.below(256) as usize
                }
                .min(self.max_value_bytes);
                Step::Mutate(Op::Put {
                    key,
                    value: make_value(self.id, key, self.seq, cycle, len),
                })
            }
            (_, 450..600) => Step::Mutate(Op::Del { key }),
            (_, 600..850) => {
                let to = (key + 1 + self.rng.below(u64::from(self.keys) - 1) as u32) % self.keys;
                Step::Mutate(Op::Link {
                    from: key,
                    to,
                    // Quarter steps are exact in binary: no rounding can
                    // make a correct answer look wrong.
                    weight: self.rng.below(4000) as f64 / 4.0,
                })
            }
            (_, 850..960) => {
                // Unlink an edge that exists when there is one.
                let existing: Vec<(u32, u32)> = self
                    .acked
                    .edges
                    .range((key, 0)..=(key, u32::MAX))
                    .map(|(e, _)| *e)
                    .collect();
                let (from, to) = match existing.as_slice() {
                    [] => (key, (key + 1) % self.keys),
                    some => some[self.rng.below(some.len() as u64) as usize],
                };
                Step::Mutate(Op::Unlink { from, to })
            }
            _ => Step::Mutate(Op::Detach { key }),
        }
    }

    /// A program step: store a program when there is none; otherwise 83 %
    /// runs, 10 % steps, 5 % replacements by a random variant, 2 %
    /// deletions.
    pub(super) fn program_step(&mut self) -> Op {
        let variant = self.rng.below(u64::from(PROGRAM_VARIANTS)) as u8;
        if self.acked.program.is_none() {
            return Op::Prog { variant };
        }
        match self.rng.below(100) {
            0..5 => Op::Prog { variant },
            5..7 => Op::ProgDelete,
            7..17 => Op::Step { tag: self.seq },
            _ => Op::Run { tag: self.seq },
        }
    }

    /// Checks a run's answer against the model: the count it returns, its
    /// telemetry sequence number and the cells it wrote follow from the
    /// acknowledged state. `false` (and a violation) if not.
    pub(super) fn check_run_reply(&mut self, cycle: usize, reply: &RunReply) -> bool {
        let Some(variant) = self.acked.program else {
            return true;
        };
        let count = self.acked.run_counter() + 1;
        let expected = (
            ProgramValue::Int(count as i64),
            self.acked.runs + 1,
            1 + marked_cells(variant),
        );
        let found = (reply.value.clone(), reply.seq, reply.cells_written);
        if found == expected {
            return true;
        }
        self.problem(
            cycle,
            Some(program_coord(self.id)),
            "a run's answer disagrees with the acknowledged state".to_owned(),
            format!(
                "returns {:?}, telemetry seq {}, {} cells written",
                expected.0, expected.1, expected.2
            ),
            format!(
                "returns {:?}, telemetry seq {}, {} cells written",
                found.0, found.1, found.2
            ),
        );
        false
    }

    /// Checks a step's answer against the model: one program ran (or none,
    /// with no program stored), none failed, and it wrote the cells the run
    /// would have. `false` (and a violation) if not.
    pub(super) fn check_step_reply(&mut self, cycle: usize, reply: &StepReply) -> bool {
        let expected = match self.acked.program {
            Some(variant) => (1, 0, 1 + marked_cells(variant)),
            None => (0, 0, 0),
        };
        let found = (reply.programs, reply.failed, reply.cells_written);
        if found == expected {
            return true;
        }
        self.problem(
            cycle,
            Some(program_coord(self.id)),
            "a step's answer disagrees with the acknowledged state".to_owned(),
            format!(
                "{} program(s) ran, {} failed, {} cells written",
                expected.0, expected.1, expected.2
            ),
            format!(
                "{} program(s) ran, {} failed, {} cells written ({:?})",
                found.0, found.1, found.2, reply.first_failure
            ),
        );
        false
    }

    /// Runs operations until the daemon goes away or the cycle stops.
    pub(super) fn run_cycle(&mut self, shared: &CycleShared<'_>) {
        self.in_flight = None;
        let mut client = match connect(shared.socket) {
            Ok(client) => client,
            Err(e) => {
                if !shared.stop.load(Ordering::SeqCst) && !is_disconnect(&e) {
                    self.problem(
                        shared.cycle,
                        None,
                        format!("cannot connect: {e}"),
                        String::new(),
                        String::new(),
                    );
                }
                return;
            }
        };
        while !shared.stop.load(Ordering::SeqCst) {
            let carry_on = match self.next_step(shared.cycle) {
                Step::Get(key) => self.get_and_check(&mut client, shared.cycle, key),
                Step::Checkpoint { compact } => match client.checkpoint(compact) {
                    Ok(_) if compact => {
                        self.compactions += 1;
                        true
                    }
                    Ok(_) => {
                        self.checkpoints += 1;
                        true
                    }
                    Err(e) => {
                        self.failed(shared.cycle, "checkpoint", &e);
                        false
                    }
                },
                Step::Mutate(op) => self.mutate(&mut client, shared, op),
            };
            if !carry_on {
                return;
            }
        }
    }

    /// Reads `key` and checks it against the acknowledged state; whether
    /// the cycle's operations go on.
    fn get_and_check(&mut self, client: &mut Client, cycle: usize, key: u32) -> bool {
        match client.get(NAMESPACE, coord(self.id, key)) {
            Ok(found) => {
                self.reads_checked += 1;
                let expected = self.acked.cells.get(&key);
                if found.as_ref() != expected {
                    self.problem(
                        cycle,
                        Some(coord(self.id, key)),
                        "a live read disagrees with the acknowledged state".to_owned(),
                        show_cell(expected),
                        show_cell(found.as_ref()),
                    );
                    return false;
                }
                true
            }
            Err(e) => {
                self.failed(cycle, "get", &e);
                false
            }
        }
    }

    /// Sends `op` (in flight until its answer) and, acknowledged and as
    /// expected, applies it to the model; whether the cycle's operations
    /// go on.
    fn mutate(&mut self, client: &mut Client, shared: &CycleShared<'_>, op: Op) -> bool {
        self.in_flight = Some(op.clone());
        match send(client, self.id, &op) {
            Ok(reply) => {
                let agrees = match &reply {
                    Answer::Done => true,
                    Answer::Put(lsn) => {
                        if let (true, Op::Put { key, value }) = (self.watched, &op) {
                            self.acked_puts.push((*lsn, *key, value.clone()));
                        }
                        true
                    }
                    Answer::Run(reply) => self.check_run_reply(shared.cycle, reply),
                    Answer::Step(reply) => self.check_step_reply(shared.cycle, reply),
                };
                if !agrees {
                    return false;
                }
                op.apply(&mut self.acked);
                self.in_flight = None;
                *self.counts.entry(op.name()).or_default() += 1;
                shared.acked.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) if e.server_code() == Some(ErrorCode::ShuttingDown) => {
                // "The write was not stored": checked absent.
                self.in_flight = None;
                self.refused_shutting_down += 1;
                false
            }
            Err(e) => {
                self.failed(shared.cycle, op.name(), &e);
                false
            }
        }
    }

    /// A request failed: expected once the daemon is killed (the in-flight
    /// operation stays uncertain), a violation otherwise.
    pub(super) fn failed(&mut self, cycle: usize, what: &str, e: &ClientError) {
        if is_disconnect(e) || e.server_code() == Some(ErrorCode::ShuttingDown) {
            return;
        }
        let op = self.in_flight.as_ref().map(|op| op.describe(self.id));
        self.problem(
            cycle,
            None,
            format!("{what} failed while the daemon was up: {e}"),
            "success".to_owned(),
            op.unwrap_or_default(),
        );
    }
}

pub(crate) fn connect(socket: &Path) -> Result<Client, ClientError> {
    let mut client = Client::connect(socket)?;
    client.set_timeout(Some(REQUEST_TIMEOUT))?;
    Ok(client)
}

/// What an operation's answer leaves to check.
pub(super) enum Answer {
    Done,
    /// A put's LSN (the watcher checks it was delivered).
    Put(u64),
    Run(RunReply),
    Step(StepReply),
}

/// Sends one operation; a run's or a step's answer comes back for
/// checking.
pub(super) fn send(client: &mut Client, id: usize, op: &Op) -> Result<Answer, ClientError> {
    pub(super) fn done<T>(_: T) -> Answer {
        Answer::Done
    }
    let at = |key: u32| coord(id, key);
    match op {
        Op::Put { key, value } => client.put(NAMESPACE, at(*key), value).map(Answer::Put),
        Op::Del { key } => client.del(NAMESPACE, at(*key)).map(done),
        Op::Link { from, to, weight } => client
            .link(NAMESPACE, at(*from), at(*to), LABEL, *weight)
            .map(done),
        Op::Unlink { from, to } => client
            .unlink(NAMESPACE, at(*from), at(*to), LABEL)
            .map(done),
        Op::Detach { key } => client.detach(NAMESPACE, at(*key)).map(done),
        Op::Prog { variant } => client
            .prog(
                NAMESPACE,
                program_coord(id),
                program_source(*variant).as_bytes(),
            )
            .map(done),
        Op::ProgDelete => client.prog(NAMESPACE, program_coord(id), b"").map(done),
        Op::Run { tag } => client
            .run(NAMESPACE, program_coord(id), &[tag.to_string().as_bytes()])
            .map(Answer::Run),
        Op::Step { tag } => {
            let (lo, hi) = program_plane(id);
            client
                .step(NAMESPACE, lo, hi, &[tag.to_string().as_bytes()])
                .map(Answer::Step)
        }
    }
}
