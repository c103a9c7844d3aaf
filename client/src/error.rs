//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

use cube_protocol::{ProtocolError, ServerError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    /// Nothing answered at the socket path, so the remedy is about starting
    /// the daemon or pointing at the right socket, not about the request.
    #[error(
        "cannot connect to {}: {}; is cubed running? start it with `make run` \
         (or pass --socket / set CUBE_SOCKET)",
        path.display(),
        plain_io_message(source)
    )]
    Connect { path: PathBuf, source: io::Error },

    #[error("i/o error talking to cubed: {}", plain_io_message(.0))]
    Io(io::Error),

    #[error("{}", describe_protocol_error(.0))]
    Protocol(ProtocolError),

    #[error("cubed refused the request: {0}")]
    Server(ServerError),

    #[error(
        "cubed speaks protocol version {server} but this client speaks {client}; \
         use a cubec/cube-client built from the same release as cubed"
    )]
    VersionMismatch { server: u16, client: u16 },

    #[error("unexpected response from cubed: {0}")]
    UnexpectedResponse(String),

    /// A watch ended asking the client to re-read the box and watch again
    /// from `lsn` (`crate::watch`).
    #[error("{}", crate::watch::describe_resync(*lsn, *reason))]
    Resync {
        lsn: u64,
        reason: cube_protocol::ResyncReason,
    },

    /// Caught before anything was sent: the request could never succeed.
    #[error("{0}")]
    BadArgument(String),

    /// The throwaway daemon of `LocalDaemon` (feature `local-daemon`) could not be found,
    /// started or stopped; the message carries its log.
    #[error("{0}")]
    Daemon(String),
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> ClientError {
        ClientError::Io(e)
    }
}

impl From<ProtocolError> for ClientError {
    fn from(e: ProtocolError) -> ClientError {
        // A timeout or reset surfaces through the frame reader; it is an I/O
        // problem, not a malformed message, and callers match on that.
        match e {
            ProtocolError::Io(io) => ClientError::Io(io),
            other => ClientError::Protocol(other),
        }
    }
}

impl From<ServerError> for ClientError {
    fn from(e: ServerError) -> ClientError {
        ClientError::Server(e)
    }
}

impl ClientError {
    /// The server's error code, when the server is the one that said no.
    pub fn server_code(&self) -> Option<cube_protocol::ErrorCode> {
        match self {
            ClientError::Server(e) => e.known_code(),
            _ => None,
        }
    }
}

/// `No such file or directory (os error 2)` reads badly mid-sentence; keep
/// the words, lowercase them, drop the errno suffix.
pub(crate) fn plain_io_message(e: &io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

fn describe_protocol_error(e: &ProtocolError) -> String {
    match e {
        ProtocolError::Closed => "cubed closed the connection".to_owned(),
        other => format!("bad response from cubed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_error_names_path_cause_and_next_step() {
        let e = ClientError::Connect {
            path: PathBuf::from("./cube-data/cubed.sock"),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(
            e.to_string(),
            "cannot connect to ./cube-data/cubed.sock: no such file or directory; \
             is cubed running? start it with `make run` (or pass --socket / set CUBE_SOCKET)"
        );
    }

    #[test]
    fn server_error_shows_message_and_code_name() {
        let e = ClientError::Server(ServerError::new(
            cube_protocol::ErrorCode::NoSuchNamespace,
            "no such namespace \"x\"",
        ));
        let text = e.to_string();
        assert!(text.contains("no such namespace \"x\""), "{text}");
        assert!(text.contains("no_such_namespace"), "{text}");
    }

    #[test]
    fn frame_reader_io_errors_become_io() {
        let e = ClientError::from(ProtocolError::Io(io::Error::from(io::ErrorKind::TimedOut)));
        assert!(matches!(e, ClientError::Io(_)));
    }
}
