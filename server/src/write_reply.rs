//! Answers to writes, delivered by the writer thread itself.
//!
//! A put used to cost its connection thread a sleep and a wake-up: it
//! blocked on the writer's reply, woke to write the response, then slept
//! again in `read`. Now the connection thread submits the write and goes
//! straight back to `read`; when the group is durable, the writer thread
//! encodes the response and sends it with a non-blocking `send` (the common
//! case: a few dozen bytes into an empty socket buffer). Only if the buffer
//! is full (a client that pipelines and is slow to read) does the rest go
//! to a short-lived thread that finishes it with a blocking write under the
//! write timeout, so the writer thread never blocks on a client.
//!
//! Ordering: a connection has at most one write in flight, and it
//! processes its next request only after [`PendingReply::wait`] says the
//! previous answer is fully sent, so responses stay in request order.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use socket2::SockRef;

#[derive(Default)]
enum State {
    #[default]
    Idle,
    InFlight,
    Sent(Result<(), io::ErrorKind>),
}

#[derive(Default)]
struct Slot {
    state: State,
    /// The connection thread sleeps in [`PendingReply::wait`]: only then
    /// does [`PendingReply::finish`] signal the condvar. A notify is a
    /// futex system call even with nobody waiting, and it would run on the
    /// writer thread once per write; the connection is rarely there first
    /// (its client must have read the answer and sent again).
    waiter: bool,
}

/// One connection's slot for its in-flight write's answer.
#[derive(Default)]
pub(crate) struct PendingReply {
    slot: Mutex<Slot>,
    done: Condvar,
}

fn lock(m: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl PendingReply {
    pub(crate) fn begin(&self) {
        let mut slot = lock(&self.slot);
        assert!(
            matches!(slot.state, State::Idle),
            "one write in flight per connection"
        );
        slot.state = State::InFlight;
    }

    fn finish(&self, outcome: Result<(), io::ErrorKind>) {
        let mut slot = lock(&self.slot);
        slot.state = State::Sent(outcome);
        let waiter = slot.waiter;
        drop(slot);
        if waiter {
            self.done.notify_one();
        }
    }

    /// Waits until the in-flight answer (if any) is fully sent; returns how
    /// its sending went.
    pub(crate) fn wait(&self) -> Result<(), io::ErrorKind> {
        let mut slot = lock(&self.slot);
        loop {
            match std::mem::take(&mut slot.state) {
                State::Idle => return Ok(()),
                State::Sent(outcome) => return outcome,
                State::InFlight => {
                    slot.state = State::InFlight;
                    slot.waiter = true;
                    slot = self
                        .done
                        .wait(slot)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    slot.waiter = false;
                }
            }
        }
    }
}

/// Sends `frame` on `stream` from the writer thread: what fits now goes
/// now, the rest is finished by a helper thread; `slot` learns the outcome.
pub(crate) fn deliver(stream: &Arc<UnixStream>, frame: Vec<u8>, slot: &Arc<PendingReply>) {
    let socket = SockRef::from(stream.as_ref());
    let mut sent = 0;
    while sent < frame.len() {
        match socket.send_with_flags(&frame[sent..], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => {
                slot.finish(Err(e.kind()));
                return;
            }
        }
    }
    if sent == frame.len() {
        slot.finish(Ok(()));
        return;
    }
    let rest = frame[sent..].to_vec();
    let (thread_stream, thread_slot) = (Arc::clone(stream), Arc::clone(slot));
    let spawned = thread::Builder::new()
        .name("cube-slow-reply".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // The socket's write timeout bounds this for a client that
            // never reads.
            let outcome = (&*thread_stream).write_all(&rest).map_err(|e| e.kind());
            thread_slot.finish(outcome);
        });
    if let Err(e) = spawned {
        // Out of threads: give up on this client rather than block the writer.
        slot.finish(Err(e.kind()));
    }
}
