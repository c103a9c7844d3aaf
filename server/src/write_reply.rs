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
//!
//! Gathering: while the writer answers a durable group, it hands each
//! answer its [`Cork`] (the store's `AnswerBatch`); answers whose turn has
//! come join their connection's cork and go out in one `send` at the
//! group's end, so pipelined writes that shared a group wake their client
//! once.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use cube_store::AnswerBatch;

use crate::client_memory::Account;
use socket2::SockRef;

/// Most writes one connection may have queued whose answers are not yet
/// sent. Bounds the parked answers and what one client can put in the
/// writer's queue; a connection that has this many waits for the oldest
/// answer before reading on.
pub(crate) const MAX_PIPELINED_WRITES: u64 = 64;

/// A `run` is queued only while fewer answers than this are outstanding on
/// its connection, so at most this many run answers (each up to a frame:
/// 16 MiB by default) are ever held for one client that does not read;
/// other writes' answers are a few dozen bytes.
pub(crate) const MAX_PIPELINED_RUNS: u64 = 4;

const _: () = assert!(MAX_PIPELINED_RUNS >= 2 && MAX_PIPELINED_RUNS <= MAX_PIPELINED_WRITES);

#[derive(Default)]
struct Slot {
    /// The sequence number the next [`PendingReply::begin`] hands out.
    next_seq: u64,
    /// The sequence number of the next answer to go on the socket;
    /// `next_seq - next_to_send` answers are outstanding.
    next_to_send: u64,
    /// Answers whose turn had come while the writer was answering a group
    /// (with a [`Cork`]): their bytes, in order, sent together when the
    /// group's answers are done ([`Cork::finish`]). They count as
    /// outstanding until then.
    cork: Vec<u8>,
    /// How many answers `cork` holds (from `next_to_send` on).
    corked: u64,
    /// Answers that are ready while an earlier one is not sent yet.
    parked: BTreeMap<u64, Vec<u8>>,
    /// A helper thread is finishing a send: every later answer waits for
    /// it (parked), so bytes never interleave.
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
            outstanding <= MAX_PIPELINED_WRITES && self.corked <= outstanding,
            "{outstanding} answers outstanding, {} corked",
            self.corked
        );
        outstanding
    }
}

/// One connection's in-flight writes' answers.
#[derive(Default)]
pub(crate) struct PendingReply {
    slot: Mutex<Slot>,
    done: Condvar,
    /// Charged with the answers parked or being sent slowly
    /// (`--max-client-memory`); `None` in unit tests.
    account: Option<Arc<Account>>,
}

impl PendingReply {
    pub(crate) fn charged_to(account: Arc<Account>) -> PendingReply {
        PendingReply {
            account: Some(account),
            ..PendingReply::default()
        }
    }

    /// Charges `bytes` held for the client. A cut connection's socket is
    /// already shut down, so its sends fail and drop what is held.
    fn charge(&self, bytes: usize) {
        if let Some(account) = &self.account {
            let _ = account.charge(bytes as u64);
        }
    }

    fn release(&self, bytes: usize) {
        if let Some(account) = &self.account {
            account.release(bytes as u64);
        }
    }

    /// Parks answer `seq` until its turn, charged.
    fn park(&self, slot: &mut Slot, seq: u64, frame: Vec<u8>) {
        self.charge(frame.len());
        slot.parked.insert(seq, frame);
    }

    /// Takes parked answer `seq` out, its charge given back.
    fn unpark(&self, slot: &mut Slot, seq: u64) -> Option<Vec<u8>> {
        let frame = slot.parked.remove(&seq)?;
        self.release(frame.len());
        Some(frame)
    }
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

    /// Counts the next `answers` answers as sent (`outcome`), and wakes
    /// the connection thread if it waits.
    ///
    /// The first failure shuts `stream` down both ways. Part of a frame
    /// may already be on the socket, so the connection is unusable; and
    /// the connection thread may be asleep reading the next request
    /// rather than in [`PendingReply::wait`], where it would see
    /// `failed`. The shutdown ends that read, and the client's, with end
    /// of stream at once, instead of leaving both hanging on half a frame
    /// until the idle timeout. It never blocks, so the writer may call it.
    fn sent(
        &self,
        stream: &UnixStream,
        slot: &mut Slot,
        answers: u64,
        outcome: Result<(), io::ErrorKind>,
    ) {
        slot.next_to_send += answers;
        if let Err(kind) = outcome
            && slot.failed.is_none()
        {
            slot.failed = Some(kind);
            // Already shut down or gone: nothing more to do either way.
            let _ = stream.shutdown(Shutdown::Both);
        }
        if slot.waiter {
            self.done.notify_one();
        }
    }
}

/// The writer's [`AnswerBatch`]: from the first answer of a durable
/// group to its end, a connection's answers are gathered and then sent in
/// one `send`: a client that pipelined several writes into one group is
/// woken once for all their answers, and the writer makes one system call
/// for them, not one each.
#[derive(Default)]
pub(crate) struct Cork {
    /// The connections with corked answers, to send in [`Cork::finish`].
    corked: Vec<(Arc<UnixStream>, Arc<PendingReply>)>,
}

impl Cork {
    /// The writer's batch (`cube_store::GroupCommitConfig::answer_batch`).
    pub(crate) fn new_batch() -> Box<dyn AnswerBatch> {
        Box::new(Cork::default())
    }
}

impl AnswerBatch for Cork {
    /// Sends every connection's gathered answers; the list keeps its
    /// allocation for the next group.
    fn finish(&mut self) {
        for (stream, pending) in self.corked.drain(..) {
            let mut slot = lock(&pending.slot);
            let bytes = std::mem::take(&mut slot.cork);
            let answers = std::mem::take(&mut slot.corked);
            send_in_turn(&stream, &pending, slot, Some((bytes, answers)));
        }
    }
}

/// Sends answer `seq` (`frame`) on `stream` once every earlier answer of
/// the connection is out: from the calling thread (the writer) what fits
/// now without blocking, the rest from a helper thread. While the writer
/// answers a group (`cork`: the group's), the answer joins the
/// connection's cork instead.
pub(crate) fn deliver(
    stream: &Arc<UnixStream>,
    seq: ReplySeq,
    frame: Vec<u8>,
    pending: &Arc<PendingReply>,
    cork: Option<&mut Cork>,
) {
    let mut slot = lock(&pending.slot);
    assert!(
        seq.0 >= slot.next_to_send + slot.corked && seq.0 < slot.next_seq,
        "answer {} delivered outside {}..{}",
        seq.0,
        slot.next_to_send + slot.corked,
        slot.next_seq
    );
    let in_turn = seq.0 == slot.next_to_send + slot.corked && !slot.slow;
    if in_turn && let Some(cork) = cork {
        if slot.corked == 0 {
            cork.corked.push((Arc::clone(stream), Arc::clone(pending)));
        }
        // A connection's only answer of the group (the common case) is
        // kept as it is, not copied.
        if slot.cork.is_empty() {
            slot.cork = frame;
        } else {
            slot.cork.extend_from_slice(&frame);
        }
        slot.corked += 1;
        // Parked answers whose turn has come join the cork.
        loop {
            let next = slot.next_to_send + slot.corked;
            let Some(frame) = pending.unpark(&mut slot, next) else {
                break;
            };
            slot.cork.extend_from_slice(&frame);
            slot.corked += 1;
        }
        return;
    }
    if in_turn && slot.corked == 0 {
        send_in_turn(stream, pending, slot, Some((frame, 1)));
    } else {
        // Behind an earlier answer, corked answers or a slow send: those
        // send it when its turn comes.
        pending.park(&mut slot, seq.0, frame);
    }
}

/// Sends `first` (the bytes of the next `answers` answers in turn), then
/// every parked answer whose turn comes, from this thread, until a send
/// does not fit; the rest goes to a helper thread.
fn send_in_turn(
    stream: &Arc<UnixStream>,
    pending: &Arc<PendingReply>,
    mut slot: MutexGuard<'_, Slot>,
    mut first: Option<(Vec<u8>, u64)>,
) {
    loop {
        let (bytes, answers) = match first.take() {
            Some(first) => first,
            None => {
                if slot.slow || slot.corked > 0 {
                    return;
                }
                let seq = slot.next_to_send;
                match pending.unpark(&mut slot, seq) {
                    Some(frame) => (frame, 1),
                    None => return,
                }
            }
        };
        if answers == 0 {
            continue;
        }
        if slot.failed.is_some() {
            pending.sent(stream, &mut slot, answers, Ok(()));
            continue;
        }
        match send_now(stream, &bytes) {
            Ok(sent) if sent == bytes.len() => pending.sent(stream, &mut slot, answers, Ok(())),
            Ok(sent) => {
                slot.slow = true;
                drop(slot);
                finish_slowly(stream, pending, bytes[sent..].to_vec(), answers);
                return;
            }
            Err(kind) => pending.sent(stream, &mut slot, answers, Err(kind)),
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

/// Stack of a slow-reply thread: it only writes and frees buffers, but its
/// first allocation sets up the allocator's state for the thread (with
/// jemalloc, a thread cache and maybe an arena), which overflowed 64 KiB in
/// debug builds and aborted cubed (`tests/tenancy.rs`,
/// `unread_run_answers_are_held_within_the_client_memory_budget`). The
/// connection threads' size; only the pages touched are resident.
const SLOW_REPLY_STACK_BYTES: usize = 256 * 1024;

/// Hands the rest of the `answers` answers now being sent, and then every
/// parked answer whose turn comes, to a helper thread that writes them
/// blocking. The slot is marked `slow` until the helper has caught up.
fn finish_slowly(
    stream: &Arc<UnixStream>,
    pending: &Arc<PendingReply>,
    rest: Vec<u8>,
    answers: u64,
) {
    let (thread_stream, thread_pending) = (Arc::clone(stream), Arc::clone(pending));
    let spawned = thread::Builder::new()
        .name("cube-slow-reply".into())
        .stack_size(SLOW_REPLY_STACK_BYTES)
        .spawn(move || {
            let (mut bytes, mut answers) = (rest, answers);
            loop {
                // The socket's write timeout bounds this for a client that
                // never reads; what it holds meanwhile is charged.
                thread_pending.charge(bytes.len());
                let outcome = (&*thread_stream).write_all(&bytes).map_err(|e| e.kind());
                thread_pending.release(bytes.len());
                let mut slot = lock(&thread_pending.slot);
                thread_pending.sent(&thread_stream, &mut slot, answers, outcome);
                loop {
                    let seq = slot.next_to_send;
                    match thread_pending.unpark(&mut slot, seq) {
                        Some(_) if slot.failed.is_some() => {
                            thread_pending.sent(&thread_stream, &mut slot, 1, Ok(()));
                        }
                        Some(frame) => {
                            (bytes, answers) = (frame, 1);
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
        // writer. Every answer after these is dropped.
        let mut slot = lock(&pending.slot);
        slot.slow = false;
        pending.sent(stream, &mut slot, answers, Err(e.kind()));
        loop {
            let seq = slot.next_to_send;
            if pending.unpark(&mut slot, seq).is_none() {
                break;
            }
            pending.sent(stream, &mut slot, 1, Ok(()));
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
            deliver(&server, seqs[i], vec![b'a' + i as u8; 3], &pending, None);
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
        deliver(&server, first, big.clone(), &pending, None);
        deliver(&server, second, b"end".to_vec(), &pending, None);
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
        deliver(&server, seqs[0], b"a".to_vec(), &pending, None);
        waiter.join().unwrap().unwrap();
        for &seq in &seqs[1..] {
            deliver(&server, seq, b"b".to_vec(), &pending, None);
        }
        pending.wait().unwrap();
    }

    #[test]
    fn a_groups_answers_to_one_connection_go_out_together_at_its_end() {
        let (server, mut client) = pair();
        client.set_nonblocking(true).unwrap();
        let pending = Arc::new(PendingReply::default());
        let seqs: Vec<ReplySeq> = (0..4).map(|_| pending.begin()).collect();
        let mut cork = Cork::default();
        deliver(&server, seqs[1], b"b".to_vec(), &pending, Some(&mut cork));
        deliver(&server, seqs[0], b"a".to_vec(), &pending, Some(&mut cork));
        deliver(&server, seqs[2], b"c".to_vec(), &pending, Some(&mut cork));
        let mut got = [0u8; 8];
        let early = client.read(&mut got);
        assert!(
            matches!(&early, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "an answer went out before its group's end: {early:?}"
        );
        cork.finish();
        // The three are sent; the fourth (not in that group) is awaited.
        pending.wait_below(2).unwrap();
        assert_eq!(client.read(&mut got).unwrap(), 3);
        assert_eq!(&got[..3], b"abc");
        // Outside a group's answers, an answer goes at once.
        deliver(&server, seqs[3], b"d".to_vec(), &pending, None);
        pending.wait().unwrap();
        assert_eq!(client.read(&mut got).unwrap(), 1);
        assert_eq!(got[0], b'd');
    }

    #[test]
    fn an_answer_from_another_thread_waits_behind_the_writers_cork() {
        let (server, mut client) = pair();
        let pending = Arc::new(PendingReply::default());
        let first = pending.begin();
        let second = pending.begin();
        let mut cork = Cork::default();
        deliver(&server, first, b"1".to_vec(), &pending, Some(&mut cork));
        // A refusal answered from another thread while the writer corks.
        {
            let (server, pending) = (Arc::clone(&server), Arc::clone(&pending));
            thread::spawn(move || deliver(&server, second, b"2".to_vec(), &pending, None))
                .join()
                .unwrap();
        }
        cork.finish();
        pending.wait().unwrap();
        let mut got = [0u8; 2];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"12");
    }

    /// A connection thread pipelining up to the limit, a "writer" thread
    /// answering them in groups (corked) in a scrambled order, a second
    /// thread answering some outside any group, and a client reading:
    /// every answer arrives, once, in order, and no one waits for ever.
    #[test]
    fn answers_from_groups_and_other_threads_all_arrive_in_order() {
        const ANSWERS: u64 = 20_000;
        let (server, mut client) = pair();
        let pending = Arc::new(PendingReply::default());
        let (to_writer, writer_rx) = std::sync::mpsc::sync_channel::<ReplySeq>(256);
        let (to_other, other_rx) = std::sync::mpsc::sync_channel::<ReplySeq>(256);
        let frame = |seq: ReplySeq| seq.0.to_le_bytes().to_vec();
        let writer = {
            let (server, pending) = (Arc::clone(&server), Arc::clone(&pending));
            thread::spawn(move || {
                let mut rng = 7u64;
                while let Ok(first) = writer_rx.recv() {
                    let mut group = vec![first];
                    group.extend(writer_rx.try_iter().take(40));
                    // Scramble the group's order (the writer may answer
                    // a refusal before an earlier write).
                    for i in (1..group.len()).rev() {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        group.swap(i, (rng % (i as u64 + 1)) as usize);
                    }
                    let mut cork = Cork::default();
                    for seq in group {
                        deliver(&server, seq, frame(seq), &pending, Some(&mut cork));
                    }
                    cork.finish();
                }
            })
        };
        let other = {
            let (server, pending) = (Arc::clone(&server), Arc::clone(&pending));
            thread::spawn(move || {
                for seq in other_rx {
                    deliver(&server, seq, frame(seq), &pending, None);
                }
            })
        };
        let reader = thread::spawn(move || {
            for want in 0..ANSWERS {
                let mut got = [0u8; 8];
                client.read_exact(&mut got).unwrap();
                assert_eq!(u64::from_le_bytes(got), want, "answers out of order");
            }
        });
        for i in 0..ANSWERS {
            pending.wait_below(MAX_PIPELINED_WRITES).unwrap();
            let seq = pending.begin();
            if i % 7 == 3 {
                to_other.send(seq).unwrap();
            } else {
                to_writer.send(seq).unwrap();
            }
            if i % 1000 == 999 {
                pending.wait().unwrap();
            }
        }
        pending.wait().unwrap();
        drop((to_writer, to_other));
        writer.join().unwrap();
        other.join().unwrap();
        reader.join().unwrap();
    }

    #[test]
    fn a_failed_send_is_reported_and_later_answers_are_dropped() {
        let (server, client) = pair();
        drop(client);
        let pending = Arc::new(PendingReply::default());
        let first = pending.begin();
        let second = pending.begin();
        deliver(&server, second, b"b".to_vec(), &pending, None);
        deliver(&server, first, b"a".to_vec(), &pending, None);
        assert!(pending.wait().is_err());
        assert!(pending.wait_below(MAX_PIPELINED_WRITES).is_err());
    }

    /// A client that stops reading mid-answer: once the write timeout
    /// gives up on it, the socket is shut down, so the client (and the
    /// connection thread, asleep reading) see end of stream after the
    /// partial frame rather than waiting for the idle timeout.
    #[test]
    fn an_answer_that_times_out_shuts_the_connection_down() {
        let (server, mut client) = pair();
        server
            .set_write_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let pending = Arc::new(PendingReply::default());
        let seq = pending.begin();
        deliver(&server, seq, vec![b'x'; 8 << 20], &pending, None);
        assert_eq!(pending.wait(), Err(io::ErrorKind::WouldBlock));
        // `server` is still open here, as the connection's is: only the
        // shutdown can end the client's read.
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert!(
            !got.is_empty() && got.len() < 8 << 20,
            "{} bytes",
            got.len()
        );
        let mut server_side = [0u8; 1];
        assert_eq!((&*server).read(&mut server_side).unwrap(), 0);
    }
}
