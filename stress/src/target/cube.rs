//! cube over `cube-client`: one `Client` per connection, namespace
//! `default` unless `--namespace` names another.

use std::path::PathBuf;
use std::time::Duration;

use cube_client::{
    Client, ClientError, Direction, ErrorCode, NamespaceName, NamespaceSpec, StatsEntry,
    StatsValue, WalkOptions,
};
use cube_protocol::{Coord, ProtocolError};

use super::{Connection, Connector, PairOutcome, ProgramAnswer, ProgramRequest, StepAnswer};
use crate::error::{OpError, StressError};

/// The namespace used when `--namespace` is not given.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A request slower than this means a wedged daemon: fail instead of
/// hanging the run.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

pub struct CubeConnector {
    socket: PathBuf,
    namespace: String,
}

impl CubeConnector {
    pub fn new(socket: PathBuf, namespace: &str) -> CubeConnector {
        CubeConnector {
            socket,
            namespace: namespace.to_owned(),
        }
    }

    /// Creates the run's namespace (encrypted if asked) unless it exists;
    /// an existing one must match `encrypted`.
    pub fn ensure_namespace(&self, encrypted: bool) -> Result<(), StressError> {
        let usage = |e: String| StressError::Usage(format!("--namespace {}: {e}", self.namespace));
        let ns = NamespaceName::new(&self.namespace).map_err(|e| usage(e.to_string()))?;
        let mut client = self.client()?;
        let spec = NamespaceSpec {
            encrypted,
            ..NamespaceSpec::default()
        };
        match client.ns_create(&ns, &spec) {
            Ok(_) => Ok(()),
            Err(e) if e.server_code() == Some(ErrorCode::NamespaceExists) => {
                let info = client.ns_info(&ns)?;
                if info.encrypted == encrypted {
                    Ok(())
                } else {
                    Err(usage(format!(
                        "exists with encrypted = {}, the run asked for {encrypted}",
                        info.encrypted
                    )))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    fn client(&self) -> Result<Client, ClientError> {
        let mut client = Client::connect(&self.socket)?;
        client.set_timeout(Some(REQUEST_TIMEOUT))?;
        Ok(client)
    }

    /// `cubed 0.1.0, --sync always`, from the daemon itself.
    pub fn describe(&self) -> Result<String, StressError> {
        let mut client = self.client()?;
        let stats = client.stats()?;
        let text = |name: &str| {
            stats.iter().find_map(|e| match &e.value {
                StatsValue::Text(t) if e.name == name => Some(t.clone()),
                _ => None,
            })
        };
        Ok(format!(
            "cubed {}, --sync {}",
            text("server.version").unwrap_or_else(|| client.server_version().to_owned()),
            text("server.sync").unwrap_or_else(|| "?".to_owned())
        ))
    }
}

impl Connector for CubeConnector {
    fn connect(&self) -> Result<Box<dyn Connection>, OpError> {
        let client = self.client().map_err(classify)?;
        Ok(Box::new(CubeConnection {
            client,
            namespace: self.namespace.clone(),
        }))
    }

    fn server_figures(&self) -> Result<Vec<StatsEntry>, String> {
        let mut client = self.client().map_err(|e| e.to_string())?;
        client.stats().map_err(|e| e.to_string())
    }
}

struct CubeConnection {
    client: Client,
    namespace: String,
}

impl Connection for CubeConnection {
    fn put(&mut self, coord: Coord, value: &[u8]) -> Result<(), OpError> {
        self.client
            .put(&self.namespace, coord, value)
            .map(drop)
            .map_err(classify)
    }

    fn get(&mut self, coord: Coord) -> Result<Option<Vec<u8>>, OpError> {
        self.client.get(&self.namespace, coord).map_err(classify)
    }

    fn mget(&mut self, coords: &[Coord]) -> Result<Vec<Option<Vec<u8>>>, OpError> {
        self.client.mget(&self.namespace, coords).map_err(classify)
    }

    fn link(&mut self, from: Coord, to: Coord) -> Result<(), OpError> {
        self.client
            .link(&self.namespace, from, to, "", 1.0)
            .map(drop)
            .map_err(classify)
    }

    fn unlink(&mut self, from: Coord, to: Coord) -> Result<(), OpError> {
        self.client
            .unlink(&self.namespace, from, to, "")
            .map(drop)
            .map_err(classify)
    }

    fn walk(&mut self, from: Coord, depth: u32) -> Result<Vec<(Coord, u32)>, OpError> {
        let options = WalkOptions {
            direction: Direction::Out,
            max_depth: depth,
            ..WalkOptions::default()
        };
        let walk = self
            .client
            .walk(&self.namespace, from, &options)
            .map_err(classify)?;
        Ok(walk
            .nodes
            .into_iter()
            .map(|n| (n.coord, n.distance))
            .collect())
    }

    fn program_request(&mut self, request: ProgramRequest<'_>) -> Result<ProgramAnswer, OpError> {
        match request {
            ProgramRequest::Prog(at, source) => self
                .client
                .prog(&self.namespace, at, source)
                .map(|_| ProgramAnswer::Stored)
                .map_err(classify),
            ProgramRequest::Run(at) => self
                .client
                .run(&self.namespace, at, &[])
                .map(|reply| ProgramAnswer::Ran { seq: reply.seq })
                .map_err(classify),
            ProgramRequest::Step(lo, hi) => self
                .client
                .step(&self.namespace, lo, hi, &[])
                .map(|reply| {
                    ProgramAnswer::Stepped(StepAnswer {
                        programs: u64::from(reply.programs),
                        failed: u64::from(reply.failed),
                        first_failure: reply.first_failure.map(|f| {
                            format!(
                                "run {} at {} ended {}: {}",
                                f.seq,
                                f.coord,
                                f.outcome.name(),
                                f.message
                            )
                        }),
                    })
                })
                .map_err(classify),
            ProgramRequest::CellStats(at) => self
                .client
                .cell_stats(&self.namespace, at, 0)
                .map(|stats| ProgramAnswer::Stats {
                    runs: stats.runs,
                    failures: stats.failures,
                })
                .map_err(classify),
        }
    }

    fn prog_and_run(&mut self, coord: Coord, source: &[u8]) -> Result<PairOutcome, OpError> {
        let (stored, ran) = self
            .client
            .prog_and_run(&self.namespace, coord, source, &[])
            .map_err(classify)?;
        Ok(PairOutcome {
            prog: stored.map(|_| ()).map_err(classify),
            run: ran.map(|reply| reply.seq).map_err(classify),
        })
    }

    fn path(&mut self, from: Coord, to: Coord) -> Result<Option<(Vec<Coord>, f64)>, OpError> {
        let answer = self
            .client
            .path(&self.namespace, from, to, None, f64::INFINITY)
            .map_err(classify)?;
        Ok(answer.path.map(|p| (p.coords, p.cost)))
    }
}

/// A lost connection (the daemon died or hung up) versus an answer that
/// says no or makes no sense.
fn classify(e: ClientError) -> OpError {
    match e {
        ClientError::Connect { .. }
        | ClientError::Io(_)
        | ClientError::Protocol(ProtocolError::Closed | ProtocolError::TruncatedFrame { .. }) => {
            OpError::Disconnected(e.to_string())
        }
        other => OpError::Failed(other.to_string()),
    }
}
