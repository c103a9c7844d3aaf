//! cube over `cube-client`: one `Client` per connection, namespace
//! `default`.

use std::path::PathBuf;
use std::time::Duration;

use cube_client::{Client, ClientError, Direction, StatsEntry, StatsValue, WalkOptions};
use cube_protocol::{Coord, ProtocolError};

use super::{Connection, Connector};
use crate::error::{OpError, StressError};

const NAMESPACE: &str = "default";

/// A request slower than this means a wedged daemon: fail instead of
/// hanging the run.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

pub struct CubeConnector {
    socket: PathBuf,
}

impl CubeConnector {
    pub fn new(socket: PathBuf) -> CubeConnector {
        CubeConnector { socket }
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
        Ok(Box::new(CubeConnection { client }))
    }

    fn server_figures(&self) -> Result<Vec<StatsEntry>, String> {
        let mut client = self.client().map_err(|e| e.to_string())?;
        client.stats().map_err(|e| e.to_string())
    }
}

struct CubeConnection {
    client: Client,
}

impl Connection for CubeConnection {
    fn put(&mut self, coord: Coord, value: &[u8]) -> Result<(), OpError> {
        self.client
            .put(NAMESPACE, coord, value)
            .map(drop)
            .map_err(classify)
    }

    fn get(&mut self, coord: Coord) -> Result<Option<Vec<u8>>, OpError> {
        self.client.get(NAMESPACE, coord).map_err(classify)
    }

    fn link(&mut self, from: Coord, to: Coord) -> Result<(), OpError> {
        self.client
            .link(NAMESPACE, from, to, "", 1.0)
            .map(drop)
            .map_err(classify)
    }

    fn unlink(&mut self, from: Coord, to: Coord) -> Result<(), OpError> {
        self.client
            .unlink(NAMESPACE, from, to, "")
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
            .walk(NAMESPACE, from, &options)
            .map_err(classify)?;
        Ok(walk
            .nodes
            .into_iter()
            .map(|n| (n.coord, n.distance))
            .collect())
    }

    fn program_request(
        &mut self,
        request: super::ProgramRequest<'_>,
    ) -> Result<(u64, u64), OpError> {
        match request {
            super::ProgramRequest::Prog(at, source) => self
                .client
                .prog(NAMESPACE, at, source)
                .map(|_| (0, 0))
                .map_err(classify),
            super::ProgramRequest::Run(at) => self
                .client
                .run(NAMESPACE, at, &[])
                .map(|reply| (reply.seq, 0))
                .map_err(classify),
            super::ProgramRequest::CellStats(at) => self
                .client
                .cell_stats(NAMESPACE, at, 0)
                .map(|stats| (stats.runs, stats.failures))
                .map_err(classify),
        }
    }

    fn path(&mut self, from: Coord, to: Coord) -> Result<Option<(Vec<Coord>, f64)>, OpError> {
        let answer = self
            .client
            .path(NAMESPACE, from, to, None, f64::INFINITY)
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
