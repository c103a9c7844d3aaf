//! [`Client`] methods for cell programs: `prog`, `run`, `step` and
//! `cell_stats` (`docs/programs.md`). Sizes and argument counts are checked here before
//! anything is sent, so an oversized request is a
//! [`ClientError::BadArgument`] naming the limit.

use cube_protocol::{
    CellStats, Coord, MAX_PROGRAM_BYTES, MAX_RUN_ARG_BYTES, MAX_RUN_ARGS, NamespaceName, Request,
    Response, RunReply, StepReply,
};

use crate::client::Client;
use crate::error::ClientError;

/// What storing a program did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The write's log sequence number.
    pub lsn: u64,
    /// Whether the cell had a program before.
    pub replaced: bool,
}

fn namespace(name: &str) -> Result<NamespaceName, ClientError> {
    NamespaceName::new(name).map_err(|e| ClientError::BadArgument(e.to_string()))
}

/// The limits `run` and `step` share: at most [`MAX_RUN_ARGS`] arguments,
/// each at most [`MAX_RUN_ARG_BYTES`].
fn check_args(args: &[&[u8]]) -> Result<(), ClientError> {
    if args.len() > MAX_RUN_ARGS {
        return Err(ClientError::BadArgument(format!(
            "{} arguments, over the limit of {MAX_RUN_ARGS}",
            args.len()
        )));
    }
    if let Some(arg) = args.iter().find(|a| a.len() > MAX_RUN_ARG_BYTES) {
        return Err(ClientError::BadArgument(format!(
            "an argument of {} bytes is over the limit of {MAX_RUN_ARG_BYTES}",
            arg.len()
        )));
    }
    Ok(())
}

fn unexpected(what: &str, response: &Response) -> ClientError {
    ClientError::UnexpectedResponse(format!(
        "{} answer to a {what} request",
        response.opcode().name()
    ))
}

impl Client {
    /// Stores the Lua program `source` at `coord` (compiled by the server
    /// first: a syntax error is a server error with code `program_syntax`
    /// and nothing is stored). An empty source removes the cell's program.
    pub fn prog(&mut self, ns: &str, coord: Coord, source: &[u8]) -> Result<Stored, ClientError> {
        if source.len() > MAX_PROGRAM_BYTES {
            return Err(ClientError::BadArgument(format!(
                "the program is {} bytes, over the limit of {MAX_PROGRAM_BYTES}",
                source.len()
            )));
        }
        let request = Request::Prog {
            ns: namespace(ns)?,
            coord,
            source: source.to_vec(),
        };
        match self.call(&request)? {
            Response::Prog { lsn, replaced } => Ok(Stored { lsn, replaced }),
            other => Err(unexpected("prog", &other)),
        }
    }

    /// Runs the program at `coord` with `args`. A program that fails (its
    /// own error, or a spent fuel or memory budget) is a server error with
    /// code `program_error`, `program_fuel` or `program_memory`; the run
    /// is recorded in the cell's telemetry either way.
    pub fn run(&mut self, ns: &str, coord: Coord, args: &[&[u8]]) -> Result<RunReply, ClientError> {
        check_args(args)?;
        let request = Request::Run {
            ns: namespace(ns)?,
            coord,
            args: args.iter().map(|a| a.to_vec()).collect(),
        };
        match self.call(&request)? {
            Response::Run(reply) => Ok(reply),
            other => Err(unexpected("run", &other)),
        }
    }

    /// Stores `source` at `coord` and runs it with `args`, pipelined: both
    /// requests go in one write and are queued together, so they share a
    /// group commit and the caller waits for one round trip, not two. The
    /// run runs the program just stored (the server applies a connection's
    /// requests in order). The outer error is the connection's; each
    /// request's refusal is its own (a syntax error refuses the `prog`,
    /// and the `run` then runs whatever program the cell held before, or
    /// fails with `invalid_argument` if it held none).
    #[allow(clippy::type_complexity)]
    pub fn prog_and_run(
        &mut self,
        ns: &str,
        coord: Coord,
        source: &[u8],
        args: &[&[u8]],
    ) -> Result<(Result<Stored, ClientError>, Result<RunReply, ClientError>), ClientError> {
        if source.len() > MAX_PROGRAM_BYTES {
            return Err(ClientError::BadArgument(format!(
                "the program is {} bytes, over the limit of {MAX_PROGRAM_BYTES}",
                source.len()
            )));
        }
        check_args(args)?;
        let ns = namespace(ns)?;
        let requests = [
            Request::Prog {
                ns: ns.clone(),
                coord,
                source: source.to_vec(),
            },
            Request::Run {
                ns,
                coord,
                args: args.iter().map(|a| a.to_vec()).collect(),
            },
        ];
        let mut answers = self.pipeline(&requests)?.into_iter();
        let (Some(prog), Some(run)) = (answers.next(), answers.next()) else {
            return Err(ClientError::UnexpectedResponse(
                "a pipeline of two requests answered fewer".into(),
            ));
        };
        let stored = prog.and_then(|response| match response {
            Response::Prog { lsn, replaced } => Ok(Stored { lsn, replaced }),
            other => Err(unexpected("prog", &other)),
        });
        let ran = run.and_then(|response| match response {
            Response::Run(reply) => Ok(reply),
            other => Err(unexpected("run", &other)),
        });
        Ok((stored, ran))
    }

    /// Runs every program stored in the box `lo..=hi` once, in the
    /// namespace's curve order, each with `args` (its own cell as
    /// `cube.x/y/z`). Every run reads the state from before the step, so
    /// no run sees another's writes (one generation of a cellular
    /// automaton). A failed run applies nothing and is recorded in its
    /// cell's telemetry; the others' writes and every run's telemetry
    /// record commit as one durable group. Failed runs are not an error:
    /// the reply counts them and carries the first. A box with `lo` above
    /// `hi` on some axis is a server error with code `invalid_argument`;
    /// more programs in the box than the server allows, `limit_exceeded`
    /// (and nothing runs).
    pub fn step(
        &mut self,
        ns: &str,
        lo: Coord,
        hi: Coord,
        args: &[&[u8]],
    ) -> Result<StepReply, ClientError> {
        check_args(args)?;
        let request = Request::Step {
            ns: namespace(ns)?,
            lo,
            hi,
            args: args.iter().map(|a| a.to_vec()).collect(),
        };
        match self.call(&request)? {
            Response::Step(reply) => Ok(reply),
            other => Err(unexpected("step", &other)),
        }
    }

    /// A cell's program telemetry: exact run and failure counts, and the
    /// `limit` most recent records (oldest first).
    pub fn cell_stats(
        &mut self,
        ns: &str,
        coord: Coord,
        limit: u32,
    ) -> Result<CellStats, ClientError> {
        let request = Request::CellStats {
            ns: namespace(ns)?,
            coord,
            limit,
        };
        match self.call(&request)? {
            Response::CellStats(stats) => Ok(stats),
            other => Err(unexpected("cell-stats", &other)),
        }
    }
}
