//! A connection's handle to the writer (`WriteSession`).

use std::any::Any;

use crossbeam_channel::{Receiver, Sender, bounded};

use cube_protocol::NamespaceName;

use super::answer::{AnswerContext, AnswerOnce, Reply, Responder, TxnAck, WriteAck};
use super::{WriterCommand, stopped};
use crate::error::{WriteError, WriteErrorKind};
use crate::mutation::Mutation;
use crate::transaction::TxnView;

/// A connection's handle to the writer, with its own reusable reply slot.
pub struct WriteSession {
    tx: Sender<WriterCommand>,
    reply_tx: Sender<Reply>,
    reply_rx: Receiver<Reply>,
    guard: Option<NamespaceGuard>,
}

impl WriteSession {
    pub(super) fn new(tx: Sender<WriterCommand>) -> WriteSession {
        let (reply_tx, reply_rx) = bounded(1);
        WriteSession {
            tx,
            reply_tx,
            reply_rx,
            guard: None,
        }
    }

    /// Pins the following writes to a namespace id (`None`: no pin).
    pub fn set_guard(&mut self, guard: Option<NamespaceGuard>) {
        self.guard = guard;
    }

    /// Blocks until the write is durable (under [`SyncPolicy::Always`]) or refused.
    pub fn write(&self, mutation: Mutation) -> Result<WriteAck, WriteError> {
        self.tx
            .send(WriterCommand::Write {
                mutation,
                reply: Responder::Channel(self.reply_tx.clone()),
                guard: self.guard.clone(),
            })
            .map_err(|_| stopped())?;
        self.reply_rx.recv().map_err(|_| stopped())?
    }

    /// Queues the write and returns at once; `on_done` runs on the writer
    /// thread when it is durable or refused (see [`Responder::Callback`]),
    /// with the group's [`AnswerContext`] when it is one of a durable group's.
    /// Saves the caller a sleep and a wake-up per write.
    pub fn submit(
        &self,
        mutation: Mutation,
        on_done: impl FnOnce(Reply, AnswerContext<'_>) + Send + 'static,
    ) {
        let command = WriterCommand::Write {
            mutation,
            reply: Responder::Callback(AnswerOnce::new(on_done)),
            guard: self.guard.clone(),
        };
        if let Err(crossbeam_channel::SendError(command)) = self.tx.send(command)
            && let WriterCommand::Write { reply, .. } = command
        {
            reply.answer(Err(stopped()));
        }
    }

    /// Runs `txn` on the writer thread against the latest state and commits
    /// what it emits atomically; blocks until that is durable. Returns the
    /// closure's result and the LSN of its first mutation (0 if none).
    pub fn transact<R: Send + 'static>(
        &self,
        txn: impl FnOnce(&mut TxnView<'_>) -> R + Send + 'static,
    ) -> Result<(R, u64), WriteError> {
        let (reply, answer) = bounded(1);
        self.tx
            .send(WriterCommand::Transact {
                txn: Box::new(move |view: &mut TxnView<'_>| {
                    Box::new(txn(view)) as Box<dyn Any + Send>
                }),
                reply: Responder::Channel(reply),
                guard: self.guard.clone(),
            })
            .map_err(|_| stopped())?;
        let ack = answer.recv().map_err(|_| stopped())??;
        downcast_ack(ack)
    }

    /// Queues `txn` like [`WriteSession::transact`] and returns at once;
    /// `on_done` runs on the writer thread with the closure's result and
    /// the LSN of its first mutation once they are durable, or with the
    /// refusal (see [`Responder::Callback`]: it must be quick and must
    /// never block). Saves the caller a sleep and a wake-up per
    /// transaction.
    pub fn transact_then<R: Send + 'static>(
        &self,
        txn: impl FnOnce(&mut TxnView<'_>) -> R + Send + 'static,
        on_done: impl FnOnce(Result<(R, u64), WriteError>, AnswerContext<'_>) + Send + 'static,
    ) {
        let command = WriterCommand::Transact {
            txn: Box::new(move |view: &mut TxnView<'_>| Box::new(txn(view)) as Box<dyn Any + Send>),
            reply: Responder::Callback(AnswerOnce::new(
                move |result: Result<TxnAck, WriteError>, context: AnswerContext<'_>| {
                    on_done(result.and_then(downcast_ack), context);
                },
            )),
            guard: self.guard.clone(),
        };
        if let Err(crossbeam_channel::SendError(command)) = self.tx.send(command)
            && let WriterCommand::Transact { reply, .. } = command
        {
            reply.answer(Err(stopped()));
        }
    }
}

/// A transaction's output as the type its closure returned.
fn downcast_ack<R: 'static>(ack: TxnAck) -> Result<(R, u64), WriteError> {
    let output = ack.output.downcast::<R>().map_err(|_| {
        WriteError::new(
            WriteErrorKind::Invalid,
            "transaction output of an unexpected type",
        )
    })?;
    Ok((*output, ack.first_lsn))
}

/// Pins a session's writes to the namespace the caller authorized them
/// against: if that namespace was dropped (or dropped and created again
/// under the same name, by someone else) before the writer reaches a write,
/// the write is refused as for a missing namespace instead of landing in
/// a namespace its sender was never allowed into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceGuard {
    pub ns: NamespaceName,
    pub id: u64,
}
