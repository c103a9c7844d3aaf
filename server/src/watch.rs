//! `watch`: a connection that follows the changes inside a box.
//!
//! The connection's thread takes the watch over: it subscribes to the live
//! groups first ([`WatchHub::subscribe`]), learns from where live delivery
//! covers them (`live_from`), replays the log from the client's `--from`
//! up to just before that, then writes live groups as they come, dropping
//! any change it already sent (by LSN). So there is no gap and no
//! duplicate at the seam. It ends with a `resync` frame (history gone, or
//! the watcher too slow), an error frame (namespace dropped, shutdown), or
//! when the client goes; the connection closes after.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, TryRecvError};
use cube_protocol::{
    CellBox, Coord, ErrorCode, NamespaceName, Opcode, Response, ResyncReason, ServerError,
    WatchChange, WatchFrame, WatchFrameEncoder,
};
use cube_store::namespace::Access;
use cube_store::wal::History;

use crate::access::{Peer, access_of};
use crate::connection::{Close, no_such_namespace};
use crate::server::Shared;
use crate::watch_hub::{Delivery, Group, Subscribed, change_of, pick};
use crate::watch_outlet::{Outlet, encode_groups};

/// How often an idle watch checks that its client is still there and the
/// daemon is not shutting down.
const IDLE_CHECK: Duration = Duration::from_millis(250);

/// Encoded changes a watch gathers before writing them out.
const FLUSH_BYTES: usize = 256 * 1024;

/// What a watch asks for.
pub(crate) struct WatchSpec {
    pub ns: NamespaceName,
    pub lo: Coord,
    pub hi: Coord,
    pub from: Option<u64>,
}

/// One watch on one connection, from its request to its end.
pub(crate) struct Watch<'a> {
    shared: &'a Arc<Shared>,
    peer: &'a Peer,
    socket: &'a mut UnixStream,
    request_id: u64,
    ns: NamespaceName,
    region: CellBox,
    encoder: WatchFrameEncoder,
    out: Vec<u8>,
}

/// What taking a delivery came to.
enum Taken {
    /// Buffer bytes now in `out`, not yet written.
    Queued(u64),
    /// The watch ended normally, for this reason.
    Ended(String),
}

/// Closes the watch's outlet when the watch ends, however it ends.
struct ClosesOutlet(Arc<Outlet>);

impl Drop for ClosesOutlet {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Serves a watch until it ends; the connection closes after.
pub(crate) fn serve(
    shared: &Arc<Shared>,
    peer: &Peer,
    socket: &mut UnixStream,
    request_id: u64,
    spec: WatchSpec,
) -> Close {
    let region = match CellBox::new(spec.lo, spec.hi) {
        Ok(region) => region,
        Err(why) => {
            return refuse(
                socket,
                request_id,
                ServerError::new(ErrorCode::InvalidArgument, why),
            );
        }
    };
    if spec.from == Some(0) {
        let error = ServerError::new(
            ErrorCode::InvalidArgument,
            "watch --from 0: LSNs start at 1; give the LSN after the last one you saw",
        );
        return refuse(socket, request_id, error);
    }
    let mut watch = Watch {
        shared,
        peer,
        socket,
        request_id,
        ns: spec.ns,
        region,
        encoder: WatchFrameEncoder::new(),
        out: Vec::new(),
    };
    match watch.run(spec.from) {
        Ok(why) => Close::Refused(format!("watch ended: {why}")),
        Err(End::Write(e)) => Close::WriteFailed(e),
        Err(End::Error(error)) => {
            let why = error.message.clone();
            match refuse(watch.socket, request_id, error) {
                Close::Refused(_) => Close::Refused(format!("watch ended: {why}")),
                other => other,
            }
        }
    }
}

/// Sends an error frame answering the watch and closes.
fn refuse(socket: &mut UnixStream, request_id: u64, error: ServerError) -> Close {
    let mut out = Vec::new();
    Response::encode_error(Opcode::Watch as u16, request_id, &error, &mut out);
    match socket.write_all(&out) {
        Ok(()) => Close::Refused(error.message),
        Err(e) => Close::WriteFailed(e),
    }
}

/// Why a watch stopped early.
enum End {
    Write(io::Error),
    Error(ServerError),
}

impl From<io::Error> for End {
    fn from(e: io::Error) -> End {
        End::Write(e)
    }
}

impl Watch<'_> {
    /// Subscribes, replays, follows. `Ok` with why it ended normally.
    fn run(&mut self, from: Option<u64>) -> Result<String, End> {
        let mem = self.shared.engine.memstore();
        let Some(meta) = mem.namespace_meta(&self.ns) else {
            return Err(End::Error(no_such_namespace(&self.ns)));
        };
        let ns_id = meta.id;
        let hub = &self.shared.watch;
        let outlet = Arc::new(Outlet::new(
            self.socket.try_clone()?,
            self.request_id,
            self.max_frame_bytes(),
        ));
        // However the watch ends, the dispatcher stops writing to the
        // socket and lets go of its copy.
        let _closing = ClosesOutlet(Arc::clone(&outlet));
        let Some(subscribed) = hub.subscribe(
            self.ns.clone(),
            self.region,
            self.shared.args.watch_buffer_bytes,
            Arc::clone(&outlet),
        ) else {
            return Err(shutting_down());
        };
        let live_from = match subscribed.rx.recv() {
            Ok(Delivery::Started { live_from }) => live_from,
            _ => return Err(shutting_down()),
        };
        // The namespace could have been dropped (and made again) between
        // the check above and the subscription taking hold.
        if mem.namespace_meta(&self.ns).map(|m| m.id) != Some(ns_id) {
            return Err(End::Error(no_such_namespace(&self.ns)));
        }
        let start = from.unwrap_or(live_from);
        self.send(&WatchFrame::Started { next_lsn: start })?;
        if start < live_from
            && let Some(resync) = self.replay(start, live_from - 1, ns_id)?
        {
            return Ok(resync);
        }
        self.follow(&subscribed, &outlet, start.max(live_from))
    }

    fn max_frame_bytes(&self) -> usize {
        self.shared.args.limits().max_frame_bytes as usize
    }

    /// Sends the log's changes `from..=until` in the box, a group at a time.
    /// `Some` when the history is gone (the resync frame is sent).
    fn replay(&mut self, from: u64, until: u64, ns_id: u64) -> Result<Option<String>, End> {
        let mut group = Group {
            first_lsn: from,
            mutations: Vec::new(),
        };
        let mut failure: Option<io::Error> = None;
        let ns = self.ns.clone();
        let region = self.region;
        let shared = self.shared;
        let history = shared
            .engine
            .read_history(from, until, |lsn, mutation, group_end| {
                // Records of an earlier namespace of the same name are not
                // this one's. (A create commits in a group of its own, so a
                // group is wholly before the namespace or wholly in it.)
                if lsn >= ns_id {
                    if group.mutations.is_empty() {
                        group.first_lsn = lsn;
                    }
                    group.mutations.push(mutation);
                }
                if !group_end || group.mutations.is_empty() {
                    return true;
                }
                let mut changes = Vec::new();
                for (at, mutation) in group.mutations.iter().enumerate() {
                    pick(mutation, at as u32, &ns, &region, |p| {
                        changes.extend(change_of(&group, p));
                    });
                }
                let ends = [changes.len() as u32];
                let sent = self.send_changes(&changes, &ends, from);
                group.mutations.clear();
                match sent {
                    Ok(()) => true,
                    Err(e) => {
                        failure = Some(e);
                        false
                    }
                }
            });
        if let Some(e) = failure {
            return Err(End::Write(e));
        }
        match history {
            Ok(History::Read) => Ok(None),
            Ok(History::Gone { oldest_lsn }) => {
                let stats = &self.shared.watch.stats;
                stats.resyncs_history_gone.fetch_add(1, Ordering::Relaxed);
                self.send(&WatchFrame::Resync {
                    lsn: oldest_lsn,
                    reason: ResyncReason::HistoryGone,
                })?;
                Ok(Some(format!(
                    "history before LSN {oldest_lsn} is gone; the client must resync"
                )))
            }
            Err(e) => Err(End::Error(ServerError::new(
                ErrorCode::StorageIo,
                format!("could not read the log back from LSN {from}: {e}"),
            ))),
        }
    }

    /// Writes live groups from `deliver_from` on until the watch ends.
    ///
    /// Deliveries already waiting are encoded together and written with
    /// one `write` (up to FLUSH_BYTES); once none is waiting the socket is
    /// handed to the dispatcher (`watch_outlet`), which writes the next
    /// changes itself until the socket fills or something needs this
    /// thread. Queued bytes leave the buffer's count once written.
    fn follow(
        &mut self,
        subscribed: &Subscribed,
        outlet: &Outlet,
        deliver_from: u64,
    ) -> Result<String, End> {
        let mut unwritten_bytes = 0u64;
        loop {
            let delivery = match subscribed.rx.try_recv() {
                Ok(delivery) => delivery,
                Err(TryRecvError::Disconnected) => return Err(shutting_down()),
                Err(TryRecvError::Empty) => {
                    self.flush(subscribed, &mut unwritten_bytes)?;
                    {
                        let mut state = outlet.lock();
                        // Checked under the lock: the dispatcher queues
                        // only while holding it with `direct` off.
                        if subscribed.rx.is_empty() {
                            Outlet::hand_over(&mut state, deliver_from);
                        }
                    }
                    match subscribed.rx.recv_timeout(IDLE_CHECK) {
                        Ok(delivery) => delivery,
                        Err(RecvTimeoutError::Timeout) => {
                            self.check_alive()?;
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => return Err(shutting_down()),
                    }
                }
            };
            if !matches!(delivery, Delivery::Changes { .. }) {
                self.flush(subscribed, &mut unwritten_bytes)?;
            }
            let taken = self.take(delivery, subscribed, outlet, deliver_from)?;
            match taken {
                Taken::Queued(bytes) => unwritten_bytes += bytes,
                Taken::Ended(why) => return Ok(why),
            }
            if self.out.len() >= FLUSH_BYTES {
                self.flush(subscribed, &mut unwritten_bytes)?;
            }
        }
    }

    /// One delivery.
    fn take(
        &mut self,
        delivery: Delivery,
        subscribed: &Subscribed,
        outlet: &Outlet,
        deliver_from: u64,
    ) -> Result<Taken, End> {
        match delivery {
            Delivery::Started { .. } => {}
            Delivery::Changes {
                changes,
                ends,
                bytes,
            } => {
                self.encode_changes(&changes, &ends, deliver_from)?;
                return Ok(Taken::Queued(bytes));
            }
            Delivery::Unsent => {
                // What the dispatcher could not write goes first.
                let unsent = std::mem::take(&mut outlet.lock().unsent);
                let written = self.socket.write_all(&unsent);
                subscribed.queued_bytes.sub(unsent.len() as u64);
                written?;
            }
            Delivery::Cut { lsn } => {
                let stats = &self.shared.watch.stats;
                stats.resyncs_too_slow.fetch_add(1, Ordering::Relaxed);
                self.send(&WatchFrame::Resync {
                    lsn,
                    reason: ResyncReason::TooSlow,
                })?;
                return Ok(Taken::Ended(format!(
                    "the watcher fell more than --watch-buffer-bytes behind; resync from LSN {lsn}"
                )));
            }
            Delivery::Dropped { lsn } => {
                return Err(End::Error(ServerError::new(
                    ErrorCode::NoSuchNamespace,
                    format!(
                        "namespace {:?} was dropped at LSN {lsn}; the watch ends",
                        self.ns.as_str()
                    ),
                )));
            }
            Delivery::Altered => {
                if access_of(self.peer, self.shared.engine.memstore(), &self.ns) < Access::ReadOnly
                {
                    return Err(End::Error(no_such_namespace(&self.ns)));
                }
            }
        }
        Ok(Taken::Queued(0))
    }

    /// Between deliveries: the daemon stopping, or the client gone or
    /// sending (a watching connection takes no more requests).
    fn check_alive(&mut self) -> Result<(), End> {
        if self.shared.shutting_down.load(Ordering::Relaxed) {
            return Err(shutting_down());
        }
        use nix::sys::socket::{MsgFlags, recv};
        use std::os::fd::AsRawFd;
        let mut byte = [0u8; 1];
        let peeked = recv(
            self.socket.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        )
        .map_err(io::Error::from);
        match peeked {
            Ok(0) => Err(End::Write(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the watcher closed the connection",
            ))),
            Ok(_) => Err(End::Error(ServerError::new(
                ErrorCode::BadRequest,
                "a watching connection takes no more requests; open another connection",
            ))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(End::Write(e)),
        }
    }

    /// Writes what `out` holds and takes its bytes off the buffer's count.
    fn flush(&mut self, subscribed: &Subscribed, unwritten_bytes: &mut u64) -> io::Result<()> {
        let written = self.socket.write_all(&self.out);
        self.out.clear();
        subscribed.queued_bytes.sub(*unwritten_bytes);
        *unwritten_bytes = 0;
        written
    }

    /// Writes a group's picked changes at once (the replay's way).
    fn send_changes(
        &mut self,
        changes: &[WatchChange],
        ends: &[u32],
        deliver_from: u64,
    ) -> io::Result<()> {
        self.out.clear();
        self.encode_changes(changes, ends, deliver_from)?;
        let written = self.socket.write_all(&self.out);
        self.out.clear();
        written
    }

    /// Appends the picked changes of groups to `out`
    /// ([`encode_groups`]); writes out early only what would outgrow
    /// [`FLUSH_BYTES`] by a frame.
    fn encode_changes(
        &mut self,
        changes: &[WatchChange],
        ends: &[u32],
        deliver_from: u64,
    ) -> io::Result<()> {
        let max_frame = self.max_frame_bytes();
        let socket = &mut *self.socket;
        let encoded = encode_groups(
            &mut self.encoder,
            self.request_id,
            max_frame,
            changes,
            ends,
            deliver_from,
            &mut self.out,
            |out| {
                if out.len() >= FLUSH_BYTES {
                    socket.write_all(out)?;
                    out.clear();
                }
                Ok(())
            },
        )?;
        let stats = &self.shared.watch.stats;
        stats
            .changes_delivered
            .fetch_add(encoded, Ordering::Relaxed);
        Ok(())
    }

    fn send(&mut self, frame: &WatchFrame) -> io::Result<()> {
        self.out.clear();
        Response::Watch(frame.clone()).encode(self.request_id, &mut self.out);
        let written = self.socket.write_all(&self.out);
        self.out.clear();
        written
    }
}

fn shutting_down() -> End {
    End::Error(ServerError::new(
        ErrorCode::ShuttingDown,
        "cubed is shutting down; the watch ends; watch again with --from the LSN after the last \
         change you saw once it restarts",
    ))
}
