//! The store's one error enum, plus the per-request write error that the
//! writer thread sends back to a waiting connection.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "data dir {path} is locked by another cubed (pid {holder}); stop it first, or use another --data"
    )]
    Locked { path: PathBuf, holder: String },
    #[error(
        "corruption in {path} at offset {offset}: {reason}; nothing read from there was used \
         (a start refuses; a checkpoint or compaction stops, and is retried later). \
         For a WAL segment, `cubed --repair` truncates the log at this point (what is dropped is reported and saved); \
         a damaged checkpoint file needs a backup (`cubed --verify DIR` lists every problem)"
    )]
    Corruption {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A path given in a request (a backup's destination) that cannot be
    /// used: nothing was written.
    #[error("bad path {path}: {reason}")]
    BadPath { path: PathBuf, reason: String },
    #[error("writes are disabled: {0}")]
    WritesDisabled(String),
    /// The master key is missing, unreadable, or not the one a namespace
    /// was encrypted with.
    #[error("{0}")]
    Key(String),
    /// The system random number generator failed (while doing what).
    #[error(
        "the system random number generator failed while {0}; cubed cannot start safely without it"
    )]
    Random(String),
    /// A crash injected by a test at a named step of a protocol.
    #[doc(hidden)]
    #[error("simulated crash at {0}")]
    SimulatedCrash(String),
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Why one write was not acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteErrorKind {
    NoSuchNamespace,
    /// An earlier I/O failure latched the writer.
    WritesDisabled,
    /// This group's `write` or `fsync` failed.
    StorageIo,
    /// This group's `write` hit ENOSPC.
    DiskFull,
    /// The writer has stopped (shutdown).
    ShuttingDown,
    /// The request broke a store limit the protocol layer did not catch.
    Invalid,
    /// A namespace of that name exists already.
    NamespaceExists,
    /// The write would take its namespace past a quota; nothing applied.
    QuotaExceeded,
    /// An encrypted namespace was asked for, but there is no master key.
    EncryptionUnavailable,
    /// A create past the namespaces one owner may hold
    /// ([`crate::GroupCommitConfig::max_namespaces_per_owner`]).
    LimitExceeded,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct WriteError {
    pub kind: WriteErrorKind,
    pub message: String,
}

impl WriteError {
    pub(crate) fn new(kind: WriteErrorKind, message: impl Into<String>) -> WriteError {
        WriteError {
            kind,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StoreError;

    /// A fold or merge meets a bad block while cubed runs: its message
    /// must not say that cubed refuses to start (it goes on serving).
    #[test]
    fn a_corruption_message_fits_a_checkpoint_as_well_as_a_start() {
        let message = StoreError::Corruption {
            path: "/data/checkpoint/run-9.run".into(),
            offset: 8192,
            reason: "block 2: checksum mismatch".into(),
        }
        .to_string();
        assert!(
            message.contains("/data/checkpoint/run-9.run at offset 8192"),
            "{message}"
        );
        assert!(!message.contains("refusing to start"), "{message}");
        assert!(
            message.contains("a checkpoint or compaction stops"),
            "{message}"
        );
    }
}
