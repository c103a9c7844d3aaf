//! How `cubec` fails: a message that says what went wrong and what to do
//! next, and the exit code that classifies it (stable: scripts rely on it).

use cube_client::{ClientError, ErrorCode, json};
use serde_json::json;

use crate::{EXIT_CONNECT, EXIT_SERVER, EXIT_USAGE};

/// A failure on its way to stderr: what went wrong, what to do about it,
/// and the exit code that classifies it.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
    /// The command already printed its own JSON answer saying so (an
    /// import's summary), so `--json` adds no failure object.
    pub(crate) reported_as_json: bool,
}

impl Failure {
    pub(crate) fn usage(message: String) -> Failure {
        Failure {
            code: EXIT_USAGE,
            message,
            reported_as_json: false,
        }
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        let code = match &error {
            ClientError::Connect { .. } => EXIT_CONNECT,
            ClientError::BadArgument(_) => EXIT_USAGE,
            _ => EXIT_SERVER,
        };
        let message = with_next_step(&error);
        Failure {
            code,
            message,
            reported_as_json: false,
        }
    }
}

/// `error`'s message, followed by what the user can do about it unless the
/// message already says so (the daemon's own messages often name the
/// command that helps: the first `command` of the advice then appears in it).
fn with_next_step(error: &ClientError) -> String {
    let message = error.to_string();
    match next_step(error) {
        Some(step) if !already_advised(&message, step) => format!("{message}; {step}"),
        _ => message,
    }
}

fn already_advised(message: &str, step: &str) -> bool {
    let mut quoted = step.split('`');
    match (quoted.next(), quoted.next()) {
        (Some(_), Some(command)) if !command.is_empty() => message.contains(command),
        _ => false,
    }
}

/// The advice for a value over the daemon's limit: the flag that raises it.
const RAISE_VALUE_LIMIT: &str = "store a smaller value, or restart cubed with a higher limit: \
     `cubed --max-value-bytes BYTES` (with --max-frame-bytes at least 1 KiB larger; \
     `cubed --help` gives the most)";

/// What the user can do about `error`, unless its message already says.
fn next_step(error: &ClientError) -> Option<&'static str> {
    Some(match error {
        ClientError::Connect { .. } | ClientError::VersionMismatch { .. } => return None,
        ClientError::BadArgument(message) if message.contains("max_value_bytes") => {
            RAISE_VALUE_LIMIT
        }
        ClientError::BadArgument(_) => "see `cubec help <command>`",
        ClientError::Io(_) | ClientError::Protocol(_) => {
            "cubed may have stopped or restarted; check its log, then retry"
        }
        ClientError::UnexpectedResponse(_) => {
            "this is a bug; check that cubec and cubed come from the same build and report it"
        }
        ClientError::Daemon(_) => "check the daemon log above",
        // Its message says what to do.
        ClientError::Resync { .. } => return None,
        ClientError::Server(e) => match e.known_code() {
            Some(ErrorCode::NoSuchNamespace) => {
                "check the namespace name; `cubec ns list` shows the namespaces you may see \
                 (a fresh data directory has only `default`)"
            }
            Some(ErrorCode::QuotaExceeded) => {
                "`cubec ns info NS` shows the namespace's use and quotas; delete data to make \
                 room, or write to a namespace with a larger quota"
            }
            Some(ErrorCode::PermissionDenied) => {
                "ask the namespace owner or an administrator (root or cubed's uid): \
                 cubec ns grant NS --uid YOUR_UID (`id -u` prints it); \
                 checkpoint and backup are for administrators only"
            }
            Some(ErrorCode::NamespaceExists) => {
                "choose another name, or `cubec ns drop NAME` first"
            }
            Some(ErrorCode::EncryptionUnavailable) => {
                "start cubed with --key-file PATH, or create the namespace without --encrypted"
            }
            Some(ErrorCode::BadNamespace) => "use 1 to 64 of a-z, 0-9, '_' and '-'",
            Some(ErrorCode::ValueTooLarge | ErrorCode::FrameTooLarge) => RAISE_VALUE_LIMIT,
            Some(ErrorCode::WritesDisabled) => {
                "cubed refuses writes until restarted after a storage failure; \
                 check its log, fix the cause and restart it"
            }
            Some(ErrorCode::ShuttingDown) => "retry once cubed is running again",
            Some(ErrorCode::TooManyConnections | ErrorCode::Overloaded) => {
                "retry shortly, or raise cubed's limits"
            }
            Some(ErrorCode::DiskFull) => "free space on cubed's data volume, then retry",
            Some(ErrorCode::InvalidArgument) => "see `cubec help <command>`",
            Some(ErrorCode::ProgramSyntax) => "fix the source and store it again",
            Some(ErrorCode::ProgramError | ErrorCode::ProgramFuel | ErrorCode::ProgramMemory) => {
                "`cubec stats NS X,Y,Z` shows the cell's recent runs; docs/programs.md the limits"
            }
            Some(ErrorCode::LimitExceeded) => {
                "ask for less (the message names the limit), or raise that cubed flag"
            }
            Some(ErrorCode::BadWeight) => "give a weight that is a finite number >= 0",
            _ => "check cubed's log for details",
        },
    })
}

/// `{"ok":false,"exit":N,"error":"..."}`: what `--json` prints on stdout
/// when a command fails (the message also goes to stderr, as without it).
pub(crate) fn failure_json(failure: &Failure) -> String {
    json::to_string(&json!({"ok": false, "exit": failure.code, "error": failure.message}))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::io;
    use std::path::PathBuf;

    #[test]
    fn advice_the_daemon_already_gave_is_not_repeated() {
        use cube_client::ServerError;
        let unknown = |message: &str| {
            ClientError::Server(ServerError::new(ErrorCode::NoSuchNamespace, message))
        };
        // The connection's answer names `cubec ns list`; the writer's does not.
        let named = with_next_step(&unknown(
            "no such namespace \"x\"; `cubec ns list` shows the ones you may use",
        ));
        assert_eq!(named.matches("cubec ns list").count(), 1, "{named}");
        let bare = with_next_step(&unknown("no such namespace \"x\""));
        assert!(
            bare.contains("; check the namespace name; `cubec ns list`"),
            "{bare}"
        );
    }

    #[test]
    fn failures_say_what_to_do_and_pick_the_exit_code() {
        let f = Failure::from(ClientError::Server(cube_client::ServerError::new(
            ErrorCode::NoSuchNamespace,
            "no such namespace \"nosuch\"",
        )));
        assert_eq!(f.code, EXIT_SERVER);
        assert!(f.message.contains("no such namespace"), "{}", f.message);
        assert!(
            f.message.contains("; check the namespace name"),
            "{}",
            f.message
        );
        let f = Failure::from(ClientError::BadArgument("value is too big".to_owned()));
        assert_eq!(f.code, EXIT_USAGE);
        let f = Failure::from(ClientError::Connect {
            path: PathBuf::from("/nope.sock"),
            source: io::Error::from(io::ErrorKind::NotFound),
        });
        assert_eq!(f.code, EXIT_CONNECT);
        assert!(f.message.contains("make run"), "{}", f.message);
    }
}
