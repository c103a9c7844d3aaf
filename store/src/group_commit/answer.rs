//! What the writer answers and where the answer goes: a channel a caller
//! blocks on, or a callback run on the writer thread.

use std::any::Any;

use crossbeam_channel::Sender;

use super::stopped;
use crate::error::WriteError;

/// What a durable write answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteAck {
    pub lsn: u64,
    /// Whether the cell had a value before this write.
    pub existed: bool,
}

pub(super) type Reply = Result<WriteAck, WriteError>;

/// Where the answer to a write goes.
pub enum Responder<T> {
    /// A channel the caller blocks on.
    Channel(Sender<Result<T, WriteError>>),
    /// Called on the writer thread once the write's group is durable (or
    /// the write is refused). It runs between groups, so it must be quick
    /// and must never block: a non-blocking socket send, say.
    Callback(AnswerOnce<T>),
}

impl<T> Responder<T> {
    pub(super) fn answer(self, result: Result<T, WriteError>) {
        match self {
            Responder::Channel(tx) => {
                let _ = tx.send(result);
            }
            Responder::Callback(mut callback) => {
                if let Some(callback) = callback.0.take() {
                    callback(result);
                }
            }
        }
    }
}

/// A callback that is called exactly once: with the write's outcome, or,
/// if it is dropped unanswered (a command still queued when the writer
/// stops, say), with `ShuttingDown`. A caller waiting on it (a connection
/// waiting for its pipelined answers) is never left waiting for ever.
/// (A dropped [`Responder::Channel`] says the same by disconnecting.)
pub struct AnswerOnce<T>(Option<AnswerFn<T>>);

type AnswerFn<T> = Box<dyn FnOnce(Result<T, WriteError>) + Send>;

impl<T> AnswerOnce<T> {
    pub fn new(callback: impl FnOnce(Result<T, WriteError>) + Send + 'static) -> AnswerOnce<T> {
        AnswerOnce(Some(Box::new(callback)))
    }
}

impl<T> Drop for AnswerOnce<T> {
    fn drop(&mut self) {
        if let Some(callback) = self.0.take() {
            callback(Err(stopped()));
        }
    }
}

/// What a committed transaction answers.
pub struct TxnAck {
    /// What the transaction's closure returned.
    pub output: Box<dyn Any + Send>,
    /// The LSN of its first mutation, 0 if it wrote nothing.
    pub first_lsn: u64,
    pub mutations: usize,
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::error::WriteErrorKind;

    /// A callback answer is given exactly once: with the outcome, or with
    /// `ShuttingDown` when its command is dropped unanswered (a past bug:
    /// a connection waiting for such an answer waited for ever).
    #[test]
    fn a_callback_is_answered_once_even_when_dropped_unanswered() {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let responder = |answers: &Arc<Mutex<Vec<Result<u64, WriteErrorKind>>>>| {
            let answers = Arc::clone(answers);
            Responder::Callback(AnswerOnce::new(move |r: Result<WriteAck, WriteError>| {
                answers
                    .lock()
                    .unwrap()
                    .push(r.map(|ack| ack.lsn).map_err(|e| e.kind));
            }))
        };
        responder(&answers).answer(Ok(WriteAck {
            lsn: 7,
            existed: false,
        }));
        drop(responder(&answers));
        assert_eq!(
            *answers.lock().unwrap(),
            vec![Ok(7), Err(WriteErrorKind::ShuttingDown)]
        );
    }
}
