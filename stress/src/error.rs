//! The crate's error types: [`StressError`] for whole runs, [`OpError`] for
//! one request.

use std::io;

use cube_client::ClientError;
use thiserror::Error;

/// Why a run could not start or finish. A run that finishes but finds
/// errors or lost writes is not an error here: its report says so.
#[derive(Debug, Error)]
pub enum StressError {
    /// A flag combination that cannot work; the message says which.
    #[error("{0}")]
    Usage(String),

    /// A peer (Redis) is not installed; the message says how to install it.
    #[error("{0}")]
    Unavailable(String),

    /// The target could not be started, reached or prepared.
    #[error("{target}: {message}")]
    Target { target: String, message: String },

    #[error(transparent)]
    Client(#[from] ClientError),

    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

impl StressError {
    pub fn target(target: impl Into<String>, message: impl Into<String>) -> StressError {
        StressError::Target {
            target: target.into(),
            message: message.into(),
        }
    }

    pub fn io(what: impl Into<String>, source: io::Error) -> StressError {
        StressError::Io {
            what: what.into(),
            source,
        }
    }
}

/// How one request failed, which decides what the client thread does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpError {
    /// The connection is gone (the daemon died or closed it): whether a
    /// write in flight landed is unknown, and the thread must reconnect.
    Disconnected(String),
    /// The target answered with an error or with nonsense.
    Failed(String),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Disconnected(message) => write!(f, "connection lost: {message}"),
            OpError::Failed(message) => f.write_str(message),
        }
    }
}
