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

/// What the answers of one durable group leave for after the group,
/// gathered on the writer thread (the server: each connection's answers,
/// sent in one `send` per connection). The writer makes one at start
/// ([`GroupCommitConfig::answer_batch`](super::GroupCommitConfig::answer_batch))
/// and keeps it: every [`Responder::Callback`] of a group's answers gets
/// it through its [`AnswerContext`], then `finish` runs once.
pub trait AnswerBatch: Any + Send {
    /// After the last answer of a group, also if an answer panicked.
    fn finish(&mut self);
}

/// What an answer callback gets besides the outcome: the group's
/// [`AnswerBatch`] while the writer answers a durable group; nothing for a
/// refusal or an answer given elsewhere (the writer stopping, say).
pub struct AnswerContext<'a>(Option<&'a mut (dyn AnswerBatch + 'static)>);

impl<'a> AnswerContext<'a> {
    pub(super) fn none() -> AnswerContext<'static> {
        AnswerContext(None)
    }

    /// The group's batch, if there is one and it is a `B`.
    pub fn batch<B: AnswerBatch>(&mut self) -> Option<&mut B> {
        let batch: &mut dyn Any = self.0.as_deref_mut()?;
        batch.downcast_mut::<B>()
    }
}

/// The writer's [`AnswerBatch`] while it answers one group: finished when
/// the group's answers are done, also if one panicked.
pub(super) struct GroupAnswers(Option<Box<dyn AnswerBatch>>);

impl GroupAnswers {
    pub(super) fn new(batch: Option<Box<dyn AnswerBatch>>) -> GroupAnswers {
        GroupAnswers(batch)
    }

    pub(super) fn context(&mut self) -> AnswerContext<'_> {
        AnswerContext(self.0.as_deref_mut())
    }

    /// Finishes the batch and hands it back for the next group.
    pub(super) fn finish(mut self) -> Option<Box<dyn AnswerBatch>> {
        let mut batch = self.0.take();
        if let Some(batch) = batch.as_mut() {
            batch.finish();
        }
        batch
    }
}

impl Drop for GroupAnswers {
    fn drop(&mut self) {
        if let Some(batch) = self.0.as_mut() {
            batch.finish();
        }
    }
}

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
    /// Answers outside a group's answers: a refusal, say.
    pub(super) fn answer(self, result: Result<T, WriteError>) {
        self.answer_in(result, AnswerContext::none());
    }

    /// Answers, a callback with `context`.
    pub(super) fn answer_in(self, result: Result<T, WriteError>, context: AnswerContext<'_>) {
        match self {
            Responder::Channel(tx) => {
                let _ = tx.send(result);
            }
            Responder::Callback(mut callback) => {
                if let Some(callback) = callback.0.take() {
                    callback(result, context);
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

type AnswerFn<T> = Box<dyn FnOnce(Result<T, WriteError>, AnswerContext<'_>) + Send>;

impl<T> AnswerOnce<T> {
    pub fn new(
        callback: impl FnOnce(Result<T, WriteError>, AnswerContext<'_>) + Send + 'static,
    ) -> AnswerOnce<T> {
        AnswerOnce(Some(Box::new(callback)))
    }
}

impl<T> Drop for AnswerOnce<T> {
    fn drop(&mut self) {
        if let Some(callback) = self.0.take() {
            callback(Err(stopped()), AnswerContext::none());
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
            Responder::Callback(AnswerOnce::new(
                move |r: Result<WriteAck, WriteError>, _| {
                    answers
                        .lock()
                        .unwrap()
                        .push(r.map(|ack| ack.lsn).map_err(|e| e.kind));
                },
            ))
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
