//! Redis as a peer: a throwaway `redis-server` on a Unix socket in a
//! temporary directory, reached through the `redis` crate.

use std::fmt::Write as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cube_client::{StatsEntry, StatsValue};
use cube_protocol::Coord;
use redis::{ConnectionAddr, RedisError};
use tempfile::TempDir;

use super::server_process::ServerProcess;
use super::{Connection, Connector};
use crate::error::{OpError, StressError};

/// How to get the peer when it is missing.
pub const INSTALL_HINT: &str = "redis-server is not installed (not found on PATH); install it \
     with `apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS) to \
     measure cube against Redis";

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What `appendonly` / `appendfsync` the server runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// AOF, fsync before each reply: durable like cube.
    Always,
    /// AOF, fsync once a second.
    Everysec,
    /// No AOF, no snapshots.
    None,
}

impl Persistence {
    fn describe(self) -> &'static str {
        match self {
            Persistence::Always => "appendonly yes, appendfsync always",
            Persistence::Everysec => "appendonly yes, appendfsync everysec",
            Persistence::None => "no persistence",
        }
    }
}

/// `redis-server` on `PATH`, if installed.
pub fn find_redis_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
}

/// A `redis-server` process the driver started; killed and its directory
/// removed on drop.
pub struct RedisServer {
    process: ServerProcess,
    socket: PathBuf,
    persistence: Persistence,
    version: String,
    // Dropped last: the process is gone by then.
    dir: TempDir,
}

impl RedisServer {
    pub fn start(persistence: Persistence) -> Result<RedisServer, StressError> {
        let binary =
            find_redis_server().ok_or_else(|| StressError::Unavailable(INSTALL_HINT.to_owned()))?;
        let dir = tempfile::Builder::new()
            .prefix("cube-stress-redis-")
            .tempdir()
            .map_err(|e| StressError::io("cannot create a temporary directory for redis", e))?;
        let socket = dir.path().join("redis.sock");
        let log = dir.path().join("redis.log");
        let mut command = Command::new(&binary);
        command
            .args(["--port", "0", "--daemonize", "no", "--save", ""])
            .arg("--unixsocket")
            .arg(&socket)
            .args(["--unixsocketperm", "700"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log);
        match persistence {
            Persistence::Always => command.args(["--appendonly", "yes", "--appendfsync", "always"]),
            Persistence::Everysec => {
                command.args(["--appendonly", "yes", "--appendfsync", "everysec"])
            }
            Persistence::None => command.args(["--appendonly", "no"]),
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| StressError::io(format!("cannot start {}", binary.display()), e))?;
        let mut server = RedisServer {
            process: ServerProcess::new(child, "redis-server", log),
            socket,
            persistence,
            version: String::new(),
            dir,
        };
        let connector = server.connector();
        server.process.wait_ready("redis", || {
            UnixStream::connect(&connector.socket).is_ok()
                && connector
                    .connect()
                    .is_ok_and(|mut connection| connection.get(Coord::new(0, 0, 0)).is_ok())
        })?;
        server.version = server
            .info_field("server", "redis_version")
            .unwrap_or_default();
        Ok(server)
    }

    pub fn connector(&self) -> RedisConnector {
        RedisConnector {
            socket: self.socket.clone(),
            persistence: self.persistence,
        }
    }

    /// The server's process id (for its RSS), `None` once it is gone.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    pub fn describe(&self) -> String {
        format!(
            "throwaway redis-server {} in {} ({})",
            self.version,
            self.dir.path().display(),
            self.persistence.describe()
        )
    }

    pub fn log_text(&self) -> String {
        self.process.log_text()
    }

    fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let text = info(&self.socket, section).ok()?;
        info_lines(&text)
            .find(|(name, _)| *name == field)
            .map(|(_, value)| value.to_owned())
    }
}

pub struct RedisConnector {
    socket: PathBuf,
    persistence: Persistence,
}

fn open(socket: &Path) -> Result<redis::Connection, RedisError> {
    let client = redis::Client::open(ConnectionAddr::Unix(socket.to_owned()))?;
    let connection = client.get_connection()?;
    connection.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    connection.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    Ok(connection)
}

fn info(socket: &Path, section: &str) -> Result<String, RedisError> {
    let mut connection = open(socket)?;
    redis::cmd("INFO").arg(section).query(&mut connection)
}

/// `name:value` lines of an INFO answer.
fn info_lines(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.trim_end().split_once(':'))
}

impl Connector for RedisConnector {
    fn connect(&self) -> Result<Box<dyn Connection>, OpError> {
        let connection = open(&self.socket).map_err(classify)?;
        Ok(Box::new(RedisConnection {
            connection,
            key: String::new(),
        }))
    }

    fn server_figures(&self) -> Result<Vec<StatsEntry>, String> {
        let commandstats = info(&self.socket, "commandstats").map_err(|e| e.to_string())?;
        let persistence = info(&self.socket, "persistence").map_err(|e| e.to_string())?;
        let mut figures = vec![StatsEntry {
            name: "server.sync".to_owned(),
            value: StatsValue::Text(self.persistence.describe().to_owned()),
        }];
        figures.extend(command_figures(&commandstats));
        for (name, value) in info_lines(&persistence) {
            if matches!(
                name,
                "aof_delayed_fsync" | "aof_rewrites" | "aof_last_write_status"
            ) {
                figures.push(StatsEntry {
                    name: format!("redis.{name}"),
                    value: value
                        .parse()
                        .map_or_else(|_| StatsValue::Text(value.to_owned()), StatsValue::Count),
                });
            }
        }
        Ok(figures)
    }
}

/// `cmdstat_set:calls=5,usec=10,usec_per_call=2.00,...` as cube's
/// `cmd.put.count` and `cmd.put.latency_us_mean` (Redis times command
/// execution only, not the wait for the AOF fsync).
fn command_figures(commandstats: &str) -> Vec<StatsEntry> {
    let mut figures = Vec::new();
    for (name, fields) in info_lines(commandstats) {
        let command = match name {
            "cmdstat_set" => "put",
            "cmdstat_get" => "get",
            "cmdstat_mget" => "mget",
            _ => continue,
        };
        for field in fields.split(',') {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            let figure = match key {
                "calls" => value.parse().ok().map(|n| ("count", StatsValue::Count(n))),
                "usec_per_call" => value
                    .parse()
                    .ok()
                    .map(|x| ("latency_us_mean", StatsValue::Float(x))),
                "failed_calls" => value.parse().ok().map(|n| ("errors", StatsValue::Count(n))),
                _ => None,
            };
            if let Some((suffix, value)) = figure {
                figures.push(StatsEntry {
                    name: format!("cmd.{command}.{suffix}"),
                    value,
                });
            }
        }
    }
    figures
}

struct RedisConnection {
    connection: redis::Connection,
    /// Reused key buffer: `x,y,z`, readable with `redis-cli GET`.
    key: String,
}

impl RedisConnection {
    fn key(&mut self, coord: Coord) -> &str {
        self.key.clear();
        let _ = write!(self.key, "{coord}");
        &self.key
    }
}

impl Connection for RedisConnection {
    fn put(&mut self, coord: Coord, value: &[u8]) -> Result<(), OpError> {
        let mut command = redis::cmd("SET");
        command.arg(self.key(coord)).arg(value);
        command.query::<()>(&mut self.connection).map_err(classify)
    }

    fn get(&mut self, coord: Coord) -> Result<Option<Vec<u8>>, OpError> {
        let mut command = redis::cmd("GET");
        command.arg(self.key(coord));
        command.query(&mut self.connection).map_err(classify)
    }

    fn mget(&mut self, coords: &[Coord]) -> Result<Vec<Option<Vec<u8>>>, OpError> {
        let mut command = redis::cmd("MGET");
        for coord in coords {
            command.arg(self.key(*coord));
        }
        command.query(&mut self.connection).map_err(classify)
    }

    fn put_many(&mut self, items: &[(Coord, Vec<u8>)]) -> Result<(), OpError> {
        let mut pipeline = redis::pipe();
        for (coord, value) in items {
            pipeline
                .cmd("SET")
                .arg(coord.to_string())
                .arg(value)
                .ignore();
        }
        pipeline.query::<()>(&mut self.connection).map_err(classify)
    }
}

fn classify(e: RedisError) -> OpError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        OpError::Disconnected(e.to_string())
    } else {
        OpError::Failed(format!("redis: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_become_cube_names() {
        let text = "# Commandstats\r\ncmdstat_set:calls=5,usec=10,usec_per_call=2.00,\
                    rejected_calls=0,failed_calls=1\r\ncmdstat_info:calls=2,usec=3\r\n";
        let figures = command_figures(text);
        let names: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["cmd.put.count", "cmd.put.latency_us_mean", "cmd.put.errors"]
        );
        assert_eq!(figures[0].value, StatsValue::Count(5));
        assert_eq!(figures[1].value, StatsValue::Float(2.0));
    }
}
