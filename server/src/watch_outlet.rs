//! A watch's socket as the watch dispatcher may write it
//! (`server/src/watch_hub.rs`), so live changes reach a caught-up watcher
//! without waking the watch's own thread.
//!
//! A thousand watches each woken per commit group cost the daemon a
//! context switch per delivery, which on a small machine ate the writers'
//! share of the CPU. So while a watch is caught up (`direct`: its thread
//! has written everything it was handed and is idle) the dispatcher
//! encodes its changes and writes them to the socket itself, without
//! blocking (`MSG_DONTWAIT`). What the socket does not take is left in
//! `unsent` and the watch's thread takes over (it writes that first, then
//! what is queued for it, then hands back once idle). Every switch happens
//! under the outlet's lock, and the dispatcher queues for the thread only
//! while holding it with `direct` off, so the bytes on the socket are in
//! the order the changes were committed. The watch thread closes the
//! outlet when the watch ends, dropping the dispatcher's copy of the
//! socket so the connection closes.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cube_protocol::{WatchChange, WatchFrameEncoder};
use nix::sys::socket::{MsgFlags, send};

/// What the dispatcher and the watch's thread share.
#[derive(Debug)]
pub(crate) struct Outlet {
    state: Mutex<OutletState>,
    request_id: u64,
    max_frame_bytes: usize,
}

#[derive(Debug)]
pub(crate) struct OutletState {
    /// The dispatcher's copy of the socket; `None` once the watch ended.
    socket: Option<UnixStream>,
    /// The dispatcher writes to the socket itself.
    pub direct: bool,
    /// Changes before this LSN were sent from the log (the seam).
    deliver_from: u64,
    /// Bytes the dispatcher encoded but the socket did not take; the
    /// watch's thread writes them before anything else.
    pub unsent: Vec<u8>,
}

/// What a direct write came to.
pub(crate) enum Direct {
    /// All of `changes` written.
    Written { changes: u64 },
    /// The socket took part (or none) of `changes`: the rest is in
    /// `unsent`, `direct` is off, and the watch's thread must be woken.
    Left { unsent_bytes: u64, changes: u64 },
    /// The client is gone.
    Gone,
}

impl Outlet {
    pub(crate) fn new(socket: UnixStream, request_id: u64, max_frame_bytes: usize) -> Outlet {
        Outlet {
            state: Mutex::new(OutletState {
                socket: Some(socket),
                direct: false,
                deliver_from: u64::MAX,
                unsent: Vec::new(),
            }),
            request_id,
            max_frame_bytes,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, OutletState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The watch's thread is caught up with nothing left to write: the
    /// dispatcher may write changes from `deliver_from` on itself.
    /// `false` (and nothing changes) if `unsent` holds bytes.
    pub(crate) fn hand_over(state: &mut OutletState, deliver_from: u64) -> bool {
        if !state.unsent.is_empty() || state.socket.is_none() {
            return false;
        }
        state.deliver_from = deliver_from;
        state.direct = true;
        true
    }

    /// The watch ended: no more direct writes, and the dispatcher's copy
    /// of the socket is closed.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.direct = false;
        state.socket = None;
    }

    /// Encodes whole groups of changes (group `k` ending before
    /// `changes[ends[k]]`) and writes them without blocking; only while
    /// `state.direct`.
    pub(crate) fn write_direct(
        &self,
        state: &mut OutletState,
        changes: &[WatchChange],
        ends: &[u32],
    ) -> Direct {
        SCRATCH.with_borrow_mut(|(encoder, out)| {
            out.clear();
            let no_split = |_: &mut Vec<u8>| Ok(());
            // Splitting never fails here: nothing is written early.
            let encoded = encode_groups(
                encoder,
                self.request_id,
                self.max_frame_bytes,
                changes,
                ends,
                state.deliver_from,
                out,
                no_split,
            )
            .unwrap_or(0);
            let direct = send_or_leave(state, out, encoded);
            // A big delivery's buffer is not kept.
            out.clear();
            out.shrink_to(SCRATCH_KEPT_BYTES);
            direct
        })
    }
}

/// Bytes of the dispatcher's encoding buffer kept between deliveries.
const SCRATCH_KEPT_BYTES: usize = 64 * 1024;

thread_local! {
    /// The dispatcher's encoder and buffer, reused for every direct write.
    static SCRATCH: std::cell::RefCell<(WatchFrameEncoder, Vec<u8>)> =
        std::cell::RefCell::new((WatchFrameEncoder::new(), Vec::new()));
}

/// Writes `out` (holding `encoded` changes) without blocking, leaving in
/// `unsent` what the socket does not take.
fn send_or_leave(state: &mut OutletState, out: &[u8], encoded: u64) -> Direct {
    if out.is_empty() {
        return Direct::Written { changes: 0 };
    }
    let Some(socket) = &state.socket else {
        return Direct::Gone;
    };
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    let mut written = 0;
    while written < out.len() {
        match send(socket.as_raw_fd(), &out[written..], flags).map_err(io::Error::from) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => {
                state.direct = false;
                return Direct::Gone;
            }
        }
    }
    if written == out.len() {
        return Direct::Written { changes: encoded };
    }
    state.direct = false;
    state.unsent = out[written..].to_vec();
    Direct::Left {
        unsent_bytes: state.unsent.len() as u64,
        changes: encoded,
    }
}

/// Appends whole groups of changes (group `k` ending before
/// `changes[ends[k]]`) from `deliver_from` on to `out`, each group in as
/// many frames as it needs (all but its last flagged `more`); calls
/// `split(out)` after each frame that does not end its group (to write
/// out early what grew big). Returns how many changes it encoded.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_groups(
    encoder: &mut WatchFrameEncoder,
    request_id: u64,
    max_frame_bytes: usize,
    changes: &[WatchChange],
    ends: &[u32],
    deliver_from: u64,
    out: &mut Vec<u8>,
    mut split: impl FnMut(&mut Vec<u8>) -> io::Result<()>,
) -> io::Result<u64> {
    let mut encoded = 0;
    let mut ends = ends.iter().map(|end| *end as usize).peekable();
    for (at, change) in changes.iter().enumerate() {
        while ends.next_if(|end| *end <= at).is_some() {
            if encoder.count() > 0 {
                encoder.finish(request_id, false, out);
            }
        }
        if change.lsn < deliver_from {
            continue;
        }
        if !encoder.fits(change, max_frame_bytes) {
            encoder.finish(request_id, true, out);
            split(out)?;
        }
        encoder.push(change);
        encoded += 1;
    }
    if encoder.count() > 0 {
        encoder.finish(request_id, false, out);
    }
    Ok(encoded)
}
