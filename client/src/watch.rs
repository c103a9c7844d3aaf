//! `watch`: following the changes inside a box, and the `scan` page that
//! says which LSN it is at (for "snapshot, then watch").

use cube_protocol::{
    CellBox, Coord, Opcode, Request, Response, ResyncReason, ScanResult, WatchChange, WatchFrame,
    frame::RESPONSE_BIT,
};

use crate::client::Client;
use crate::error::ClientError;
use crate::scan::ScanPage;

/// The changes of one commit group inside the box, in LSN order (all of a
/// program run's or a batch's writes there, never part of them).
#[derive(Clone, Debug, PartialEq)]
pub struct WatchGroup {
    pub changes: Vec<WatchChange>,
}

impl WatchGroup {
    /// The group's last LSN: watch again `--from` one past it to go on.
    pub fn last_lsn(&self) -> u64 {
        self.changes.last().map_or(0, |c| c.lsn)
    }
}

/// A running watch: an iterator of commit groups, blocking until the next
/// one. It ends with an error: [`ClientError::Resync`] when the server
/// asks the client to re-read the box, or the connection's failure.
/// After an error it yields nothing more.
pub struct Watch {
    client: Client,
    request_id: u64,
    next_lsn: u64,
    ended: bool,
}

impl Client {
    /// Starts following `region` of `ns`. With `from`, changes from that
    /// LSN on come first (replayed from the log), then live ones, with no
    /// gap and no duplicate. The connection becomes the watch's.
    pub fn watch(
        mut self,
        ns: &str,
        region: CellBox,
        from: Option<u64>,
    ) -> Result<Watch, ClientError> {
        let request = Request::Watch {
            ns: crate::client::namespace(ns)?,
            lo: region.lo(),
            hi: region.hi(),
            from,
        };
        let request_id = self.send_only(&request)?;
        let mut watch = Watch {
            client: self,
            request_id,
            next_lsn: 0,
            ended: false,
        };
        match watch.next_frame()? {
            WatchFrame::Started { next_lsn } => {
                watch.next_lsn = next_lsn;
                Ok(watch)
            }
            other => Err(ClientError::UnexpectedResponse(format!(
                "expected the watch to start, got {other:?}"
            ))),
        }
    }

    /// One page of the cells inside `region` (as [`Client::scan_page`])
    /// and an LSN it is at: every change up to that LSN is in the page,
    /// so watching `--from` one past it misses nothing (a change the page
    /// already shows may come again; applying it again changes nothing).
    pub fn scan_page_with_lsn(
        &mut self,
        ns: &str,
        region: &CellBox,
        limit: u32,
        after: Option<Coord>,
    ) -> Result<(ScanPage, u64), ClientError> {
        let request = Request::Scan {
            ns: crate::client::namespace(ns)?,
            lo: region.lo(),
            hi: region.hi(),
            limit: limit.max(1),
            count_only: false,
            after,
            with_lsn: true,
        };
        match self.call(&request)? {
            Response::Scan {
                result: ScanResult::Cells(cells),
                resume_after,
                lsn: Some(lsn),
            } => Ok((
                ScanPage {
                    cells,
                    resume_after,
                },
                lsn,
            )),
            other => Err(ClientError::UnexpectedResponse(format!(
                "expected a scan page with its LSN, got {other:?}"
            ))),
        }
    }
}

impl Watch {
    /// The first LSN this watch delivers (from the `started` frame).
    pub fn start_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// Read timeout for the next group; `None` blocks until one comes.
    pub fn set_timeout(&mut self, timeout: Option<std::time::Duration>) -> Result<(), ClientError> {
        self.client.set_timeout(timeout)
    }

    /// The next frame of this watch, checked to be one.
    fn next_frame(&mut self) -> Result<WatchFrame, ClientError> {
        let (header, outcome) = self.client.read_response()?;
        if header.request_id != self.request_id
            || header.opcode != Opcode::Watch as u16 | RESPONSE_BIT
        {
            return Err(ClientError::UnexpectedResponse(format!(
                "a frame with opcode 0x{:04x} and id {} in a watch (id {})",
                header.opcode, header.request_id, self.request_id
            )));
        }
        match outcome? {
            Response::Watch(frame) => Ok(frame),
            other => Err(ClientError::UnexpectedResponse(format!(
                "expected a watch frame, got {other:?}"
            ))),
        }
    }

    /// The next whole commit group.
    fn next_group(&mut self) -> Result<WatchGroup, ClientError> {
        let mut changes = Vec::new();
        loop {
            match self.next_frame()? {
                WatchFrame::Changes {
                    more,
                    changes: part,
                } => {
                    changes.extend(part);
                    if !more {
                        break;
                    }
                }
                WatchFrame::Resync { lsn, reason } => {
                    return Err(ClientError::Resync { lsn, reason });
                }
                WatchFrame::Started { .. } => {
                    return Err(ClientError::UnexpectedResponse(
                        "a second started frame in a watch".into(),
                    ));
                }
            }
        }
        Ok(WatchGroup { changes })
    }
}

impl Iterator for Watch {
    type Item = Result<WatchGroup, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        let group = self.next_group();
        match &group {
            Ok(group) => self.next_lsn = self.next_lsn.max(group.last_lsn() + 1),
            Err(_) => self.ended = true,
        }
        Some(group)
    }
}

/// Why a watch asked to resync, for messages.
pub fn describe_resync(lsn: u64, reason: ResyncReason) -> String {
    match reason {
        ResyncReason::HistoryGone => format!(
            "the log no longer holds the changes asked for (the oldest still there is LSN {lsn}); \
             re-read the box with `cubec scan --lsn` and watch again --from the LSN after the \
             scan's"
        ),
        ResyncReason::TooSlow => format!(
            "this watcher fell further behind than cubed's --watch-buffer-bytes and was cut off; \
             watch again --from {lsn} (or, if that history is gone too, re-read the box)"
        ),
    }
}
