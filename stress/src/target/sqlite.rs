//! SQLite as a peer: a database file in a temporary directory, WAL mode,
//! `synchronous=FULL` (every commit fsyncs the WAL), one transaction per
//! write, one connection per client. The bundled SQLite of `rusqlite`, so
//! nothing needs installing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use cube_client::{StatsEntry, StatsValue};
use cube_protocol::Coord;
use rusqlite::{OptionalExtension, TransactionBehavior, params};
use tempfile::TempDir;

use super::{Connection, Connector};
use crate::error::{OpError, StressError};

/// Writers queue on SQLite's one write lock; a wait this long is a hang.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS cells (
    x INTEGER NOT NULL, y INTEGER NOT NULL, z INTEGER NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (x, y, z)) WITHOUT ROWID";
const UPSERT: &str = "INSERT INTO cells (x, y, z, value) VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (x, y, z) DO UPDATE SET value = excluded.value";
const SELECT: &str = "SELECT value FROM cells WHERE x = ?1 AND y = ?2 AND z = ?3";

/// The database file; removed with its directory on drop.
pub struct SqliteFile {
    path: PathBuf,
    // Kept for its Drop.
    dir: TempDir,
}

impl SqliteFile {
    pub fn create() -> Result<SqliteFile, StressError> {
        let dir = tempfile::Builder::new()
            .prefix("cube-stress-sqlite-")
            .tempdir()
            .map_err(|e| StressError::io("cannot create a temporary directory for sqlite", e))?;
        let path = dir.path().join("cells.db");
        let connection = open(&path).map_err(|e| StressError::target("sqlite", e))?;
        connection
            .execute_batch(CREATE_TABLE)
            .map_err(|e| StressError::target("sqlite", e.to_string()))?;
        Ok(SqliteFile { path, dir })
    }

    pub fn connector(&self) -> SqliteConnector {
        SqliteConnector {
            path: self.path.clone(),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "SQLite {} in {} (WAL, synchronous=FULL, one transaction per write)",
            rusqlite::version(),
            self.dir.path().display()
        )
    }
}

fn open(path: &PathBuf) -> Result<rusqlite::Connection, String> {
    let sqlite = |e: rusqlite::Error| format!("sqlite: {e}");
    let connection = rusqlite::Connection::open(path).map_err(sqlite)?;
    connection.busy_timeout(BUSY_TIMEOUT).map_err(sqlite)?;
    let mode: String = connection
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(sqlite)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("sqlite: journal_mode is {mode}, not WAL"));
    }
    connection
        .pragma_update(None, "synchronous", "FULL")
        .map_err(sqlite)?;
    Ok(connection)
}

pub struct SqliteConnector {
    path: PathBuf,
}

impl Connector for SqliteConnector {
    fn connect(&self) -> Result<Box<dyn Connection>, OpError> {
        let connection = open(&self.path).map_err(OpError::Failed)?;
        Ok(Box::new(SqliteConnection { connection }))
    }

    fn server_figures(&self) -> Result<Vec<StatsEntry>, String> {
        Ok(vec![StatsEntry {
            name: "server.sync".to_owned(),
            value: StatsValue::Text("journal_mode=WAL, synchronous=FULL".to_owned()),
        }])
    }
}

struct SqliteConnection {
    connection: rusqlite::Connection,
}

impl Connection for SqliteConnection {
    fn put(&mut self, coord: Coord, value: &[u8]) -> Result<(), OpError> {
        self.put_many_refs(std::iter::once((coord, value)))
    }

    fn get(&mut self, coord: Coord) -> Result<Option<Vec<u8>>, OpError> {
        let mut statement = self.connection.prepare_cached(SELECT).map_err(failed)?;
        statement
            .query_row(params![coord.x, coord.y, coord.z], |row| row.get(0))
            .optional()
            .map_err(failed)
    }

    /// One statement, `SELECT x, y, z, value FROM cells WHERE (x, y, z) IN
    /// (VALUES (?, ?, ?), ...)`, so the batch is one read of one snapshot;
    /// rows come back in any order and are matched to `coords` by
    /// coordinate.
    fn mget(&mut self, coords: &[Coord]) -> Result<Vec<Option<Vec<u8>>>, OpError> {
        let sql = mget_sql(coords.len());
        let mut statement = self.connection.prepare_cached(&sql).map_err(failed)?;
        let bound: Vec<i32> = coords.iter().flat_map(|c| [c.x, c.y, c.z]).collect();
        let mut found: HashMap<Coord, Vec<u8>> = HashMap::with_capacity(coords.len());
        let mut rows = statement
            .query(rusqlite::params_from_iter(bound))
            .map_err(failed)?;
        while let Some(row) = rows.next().map_err(failed)? {
            let coord = Coord::new(
                row.get(0).map_err(failed)?,
                row.get(1).map_err(failed)?,
                row.get(2).map_err(failed)?,
            );
            found.insert(coord, row.get(3).map_err(failed)?);
        }
        Ok(coords.iter().map(|c| found.get(c).cloned()).collect())
    }

    fn put_many(&mut self, items: &[(Coord, Vec<u8>)]) -> Result<(), OpError> {
        self.put_many_refs(items.iter().map(|(c, v)| (*c, v.as_slice())))
    }
}

impl SqliteConnection {
    /// One transaction, taking the write lock up front (`BEGIN IMMEDIATE`)
    /// so concurrent writers queue in the busy handler instead of failing
    /// a lock upgrade.
    fn put_many_refs<'a>(
        &mut self,
        items: impl Iterator<Item = (Coord, &'a [u8])>,
    ) -> Result<(), OpError> {
        let transaction = self
            .connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(failed)?;
        {
            let mut statement = transaction.prepare_cached(UPSERT).map_err(failed)?;
            for (coord, value) in items {
                statement
                    .execute(params![coord.x, coord.y, coord.z, value])
                    .map_err(failed)?;
            }
        }
        transaction.commit().map_err(failed)
    }
}

/// The `mget` statement for `cells` coordinates (at least one).
fn mget_sql(cells: usize) -> String {
    let mut sql = String::from("SELECT x, y, z, value FROM cells WHERE (x, y, z) IN (VALUES ");
    for i in 0..cells.max(1) {
        sql.push_str(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" });
    }
    sql.push(')');
    sql
}

fn failed(e: rusqlite::Error) -> OpError {
    OpError::Failed(format!("sqlite: {e}"))
}
