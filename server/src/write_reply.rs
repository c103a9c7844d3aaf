//! Answers to writes, delivered by the writer thread itself, in request
//! order, with up to [`MAX_PIPELINED_WRITES`] in flight per connection.
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
//! Pipelining: a client that sends writes back to back has them all queued
//! at once (so consecutive writes of one client share a group and its
//! `fdatasync`, as pipelined writes do in Redis), up to
//! [`MAX_PIPELINED_WRITES`]; a read, or any other request, first waits
//! ([`PendingReply::wait`]) until every earlier answer is sent, so it sees
//! those writes and its answer comes after theirs.
//!
//! Ordering: each write takes a sequence number when it is queued
//! ([`PendingReply::begin`]); an answer that is ready before an earlier
//! one (a write refused at once while the one before waits for its fsync)
//! is parked until its turn, so responses always go out in request order
//! (`docs/protocol.md`, section 5) whatever order the writer answers in.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use socket2::SockRef;

/// Most writes one connection may have queued whose answers are not yet
/// sent. Bounds the parked answers and what one client can put in the
/// writer's queue; a connection that has this many waits for the oldest
/// answer before reading on.
pub(crate) const MAX_PIPELINED_WRITES: u64 = 64;

#[derive(Default)]
struct Slot {
    /// The sequence number the next [`PendingReply::begin`] hands out.
    next_seq: u64,
    /// The sequence number of the next answer to go on the socket;
    /// `next_seq - next_to_send` answers are outstanding.
    next_to_send: u64,
    /// Answers that are ready while an earlier one is not sent yet.
    parked: BTreeMap<u64, Vec<u8>>,
    /// A helper thread is finishing an answer's send; every later answer
    /// waits for it (parked), so bytes never interleave.
    slow: bool,
    /// The first send that failed: the connection is closing, later
    /// answers are dropped.
    failed: Option<io::ErrorKind>,
    /// The connection thread sleeps in [`PendingReply::wait`] or
    /// [`PendingReply::wait_below`]: only then is the condvar signalled. A
    /// notify is a futex system call even with nobody waiting, and it would
    /// run on the writer thread once per write; the connection is rarely
    /// there first (its client must have read the answer and sent again).
    waiter: bool,
}

impl Slot {
    fn outstanding(&self) -> u64 {
        let outstanding = self.next_seq - self.next_to_send;
        assert!(
            outstanding <= MAX_PIPELINED_WRITES,
            "{outstanding} answers outstanding"
        );
        outstanding
    }
}

/// One connection's in-flight writes' answers.
#[derive(Default)]
pub(crate) struct PendingReply {
    slot: Mutex<Slot>,
    done: Condvar,
}

fn lock(m: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An answer's place in its connection's order, from
/// [`PendingReply::begin`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReplySeq(u64);

impl PendingReply {
    /// Takes the next place in the answer order. The caller has made room
    /// with [`PendingReply::wait_below`].
    pub(crate) fn begin(&self) -> ReplySeq {
        let mut slot = lock(&self.slot);
        assert!(
            slot.outstanding() < MAX_PIPELINED_WRITES,
            "more than {MAX_PIPELINED_WRITES} writes in flight on a connection"
        );
        let seq = slot.next_seq;
        slot.next_seq += 1;
        ReplySeq(seq)
    }

    /// Waits until every answer begun so far is fully sent; returns how
    /// their sending went.
    pub(crate) fn wait(&self) -> Result<(), io::ErrorKind> {
        self.wait_below(1)
    }

    /// Waits until fewer than `limit` answers are outstanding (`limit` 1:
    /// none), or a send has failed.
    pub(crate) fn wait_below(&self, limit: u64) -> Result<(), io::ErrorKind> {
        assert!((1..=MAX_PIPELINED_WRITES).contains(&limit), "limit {limit}");
        let mut slot = lock(&self.slot);
        loop {
            if let Some(kind) = slot.failed {
                return Err(kind);
            }
            if slot.outstanding() < limit {
                return Ok(());
            }
            slot.waiter = true;
            slot = self
                .done
                .wait(slot)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            slot.waiter = false;
        }
    }

    /// Counts `seq`'s answer as sent (`outcome`), and wakes the connection
    /// thread if it waits.
    fn sent(&self, slot: &mut Slot, outcome: Result<(), io::ErrorKind>) {
        slot.next_to_send += 1;
        if let Err(kind) = outcome {
            slot.failed.get_or_insert(kind);
        }
        if slot.waiter {
            self.done.notify_one();
        }
    }
}

/// Sends answer `seq` (`frame`) on `stream` once every earlier answer of
/// the connection is out: from the calling thread (the writer) what fits
/// now without blocking, the rest from a helper thread.
pub(crate) fn deliver(
    stream: &Arc<UnixStream>,
    seq: ReplySeq,
    frame: Vec<u8>,
    pending: &Arc<PendingReply>,
) {
    let mut slot = lock(&pending.slot);
    assert!(
        seq.0 >= slot.next_to_send && seq.0 < slot.next_seq,
        "answer {} delivered outside {}..{}",
        seq.0,
        slot.next_to_send,
        slot.next_seq
    );
    let mut next = None;
    if seq.0 == slot.next_to_send && !slot.slow {
        next = Some(frame);
    } else {
        slot.parked.insert(seq.0, frame);
    }
    loop {
        let frame = match next.take() {
            Some(frame) => frame,
            None => {
                let seq = slot.next_to_send;
                if slot.slow {
                    return;
                }
                match slot.parked.remove(&seq) {
                    Some(frame) => frame,
                    None => return,
                }
            }
        };
        if slot.failed.is_some() {
            pending.sent(&mut slot, Ok(()));
            continue;
        }
        match send_now(stream, &frame) {
            Ok(sent) if sent == frame.len() => pending.sent(&mut slot, Ok(())),
            Ok(sent) => {
                slot.slow = true;
                drop(slot);
                finish_slowly(stream, pending, frame[sent..].to_vec());
                return;
            }
            Err(kind) => pending.sent(&mut slot, Err(kind)),
        }
    }
}

/// How much of `frame` a non-blocking send took.
fn send_now(stream: &UnixStream, frame: &[u8]) -> Result<usize, io::ErrorKind> {
    let socket = SockRef::from(stream);
    let mut sent = 0;
    while sent < frame.len() {
        match socket.send_with_flags(&frame[sent..], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e.kind()),
        }
    }
    Ok(sent)
}

/// Hands the rest of the answer now being sent, and then every parked
/// answer whose turn comes, to a helper thread that writes them blocking.
/// The slot is marked `slow` until the helper has caught up.
fn finish_slowly(stream: &Arc<UnixStream>, pending: &Arc<PendingReply>, rest: Vec<u8>) {
    let (thread_stream, thread_pending) = (Arc::clone(stream), Arc::clone(pending));
    let spawned = thread::Builder::new()
        .name("cube-slow-reply".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut bytes = rest;
            loop {
                // The socket's write timeout bounds this for a client that
                // never reads.
                let outcome = (&*thread_stream).write_all(&bytes).map_err(|e| e.kind());
                let mut slot = lock(&thread_pending.slot);
                thread_pending.sent(&mut slot, outcome);
                loop {
                    let seq = slot.next_to_send;
                    match slot.parked.remove(&seq) {
                        Some(_) if slot.failed.is_some() => thread_pending.sent(&mut slot, Ok(())),
                        Some(frame) => {
                            bytes = frame;
                            break;
                        }
                        None => {
                            slot.slow = false;
                            return;
                        }
                    }
                }
            }
        });
    if let Err(e) = spawned {
        // Out of threads: give up on this client rather than block the
        // writer. Every answer after this one is dropped.
        let mut slot = lock(&pending.slot);
        slot.slow = false;
        pending.sent(&mut slot, Err(e.kind()));
        loop {
            let seq = slot.next_to_send;
            if slot.parked.remove(&seq).is_none() {
                break;
            }
            pending.sent(&mut slot, Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::io::Read;

    fn pair() -> (Arc<UnixStream>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Arc::new(a), b)
    }

    #[test]
    fn answers_ready_out_of_order_go_out_in_order() {
        let (server, mut client) = pair();
        let pending = Arc::new(PendingReply::default());
        let seqs: Vec<ReplySeq> = (0..5).map(|_| pending.begin()).collect();
        for &i in &[3usize, 1, 4, 0, 2] {
            deliver(&server, seqs[i], vec![b'a' + i as u8; 3], &pending);
        }
        pending.wait().unwrap();
        let mut got = [0u8; 15];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"aaabbbcccdddeee");
    }

    #[test]
    fn a_full_socket_buffer_keeps_later_answers_behind_the_slow_one() {
        let (server, mut client) = pair();
        let pending = Arc::new(PendingReply::default());
        // Bigger than any socket buffer: finished by the helper thread.
        let big = vec![b'x'; 8 << 20];
        let first = pending.begin();
        let second = pending.begin();
        deliver(&server, first, big.clone(), &pending);
        deliver(&server, second, b"end".to_vec(), &pending);
        let reader = thread::spawn(move || {
            let mut all = Vec::new();
            client.read_to_end(&mut all).unwrap();
            all
        });
        pending.wait().unwrap();
        drop(server);
        let all = reader.join().unwrap();
        assert_eq!(all.len(), big.len() + 3);
        assert!(all[..big.len()].iter().all(|&b| b == b'x'));
        assert_eq!(&all[big.len()..], b"end");
    }

    #[test]
    fn wait_below_lets_a_pipeline_run_up_to_its_limit() {
        let (server, _client) = pair();
        let pending = Arc::new(PendingReply::default());
        let seqs: Vec<ReplySeq> = (0..MAX_PIPELINED_WRITES).map(|_| pending.begin()).collect();
        let waiter = {
            let pending = Arc::clone(&pending);
            thread::spawn(move || pending.wait_below(MAX_PIPELINED_WRITES))
        };
        thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished(), "a full pipeline must wait");
        deliver(&server, seqs[0], b"a".to_vec(), &pending);
        waiter.join().unwrap().unwrap();
        for &seq in &seqs[1..] {
            deliver(&server, seq, b"b".to_vec(), &pending);
        }
        pending.wait().unwrap();
    }

    #[test]
    fn a_failed_send_is_reported_and_later_answers_are_dropped() {
        let (server, client) = pair();
        drop(client);
        let pending = Arc::new(PendingReply::default());
        let first = pending.begin();
        let second = pending.begin();
        deliver(&server, second, b"b".to_vec(), &pending);
        deliver(&server, first, b"a".to_vec(), &pending);
        assert!(pending.wait().is_err());
        assert!(pending.wait_below(MAX_PIPELINED_WRITES).is_err());
    }
}
