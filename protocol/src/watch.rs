//! `watch` (opcode 0x0050): a stream of the changes inside a box.
//!
//! One request, then any number of response frames carrying the request's
//! id, each a [`WatchFrame`]: first `started`, then `changes` frames in LSN
//! order (a commit group's changes inside the box are never split across
//! groups: a group too big for one frame goes in several, all but the last
//! flagged `more`), until the stream ends with a `resync` frame or an error
//! frame. `docs/protocol.md` section "watch" gives every byte.

use crate::bulk::{put_optional_u64, read_optional_u64};
use crate::edge::{EdgeLabel, put_f64, put_label, read_count, read_f64, read_label};
use crate::error::DecodeError;
use crate::model::{Coord, NamespaceName};
use crate::program::MAX_PROGRAM_BYTES;
use crate::wire::{BodyReader, put_blob, put_coord, put_namespace, put_u32, put_u64};

/// Most changes in one `changes` frame; a bigger group goes in several.
pub const MAX_WATCH_FRAME_CHANGES: u32 = 65_536;

/// The smallest encoded change: LSN, op and coordinate.
const MIN_CHANGE_BYTES: usize = 8 + 1 + 12;

const FRAME_STARTED: u8 = 0;
const FRAME_CHANGES: u8 = 1;
const FRAME_RESYNC: u8 = 2;

const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;
const OP_LINK: u8 = 3;
const OP_UNLINK: u8 = 4;
const OP_PROGRAM_PUT: u8 = 5;
const OP_PROGRAM_DEL: u8 = 6;

/// `changes` flags: bit 0, more frames of the same commit group follow.
const CHANGES_FLAG_MORE: u8 = 1;

/// What happened at one coordinate of the box.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchOp {
    /// The cell's value is now this.
    Put(Vec<u8>),
    /// The cell's value is gone.
    Del,
    /// The edge `coord -> to` with `label` exists now with `weight`.
    Link {
        to: Coord,
        label: EdgeLabel,
        weight: f64,
    },
    /// The edge `coord -> to` with `label` is gone.
    Unlink { to: Coord, label: EdgeLabel },
    /// A program is stored at the cell (replacing any).
    ProgramPut(Vec<u8>),
    /// The cell's program is gone.
    ProgramDel,
}

impl WatchOp {
    /// The name `cubec watch` prints.
    pub fn name(&self) -> &'static str {
        match self {
            WatchOp::Put(_) => "put",
            WatchOp::Del => "del",
            WatchOp::Link { .. } => "link",
            WatchOp::Unlink { .. } => "unlink",
            WatchOp::ProgramPut(_) => "prog",
            WatchOp::ProgramDel => "unprog",
        }
    }
}

/// One change inside the box, with the LSN of the log record that made it
/// (a `detach` gives several changes of one LSN).
#[derive(Clone, Debug, PartialEq)]
pub struct WatchChange {
    pub lsn: u64,
    pub coord: Coord,
    pub op: WatchOp,
}

/// Why a stream ended asking the client to re-read the box.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ResyncReason {
    /// The history asked for is no longer in the log (folded into a
    /// checkpoint); `lsn` is the oldest LSN still available.
    HistoryGone = 1,
    /// The watcher fell further behind than its buffer
    /// (`--watch-buffer-bytes`); `lsn` is the first change it did not get.
    TooSlow = 2,
}

impl ResyncReason {
    pub fn from_u8(raw: u8) -> Option<ResyncReason> {
        match raw {
            1 => Some(ResyncReason::HistoryGone),
            2 => Some(ResyncReason::TooSlow),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ResyncReason::HistoryGone => "history_gone",
            ResyncReason::TooSlow => "too_slow",
        }
    }
}

/// One frame of a watch stream.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchFrame {
    /// The watch is set up: every change from `next_lsn` on will follow.
    Started { next_lsn: u64 },
    /// Changes in LSN order; `more`: the same commit group goes on in the
    /// next frame.
    Changes {
        more: bool,
        changes: Vec<WatchChange>,
    },
    /// The stream ends: re-read the box (`scan`) and watch again from
    /// `lsn` (see [`ResyncReason`]).
    Resync { lsn: u64, reason: ResyncReason },
}

pub(crate) fn put_watch_request(
    b: &mut Vec<u8>,
    ns: &NamespaceName,
    lo: Coord,
    hi: Coord,
    from: Option<u64>,
) {
    put_namespace(b, ns);
    put_coord(b, lo);
    put_coord(b, hi);
    put_optional_u64(b, from);
}

/// The fields after the opcode: `(ns, lo, hi, from)`.
pub(crate) type WatchRequest = (NamespaceName, Coord, Coord, Option<u64>);

pub(crate) fn read_watch_request(r: &mut BodyReader<'_>) -> Result<WatchRequest, DecodeError> {
    Ok((
        r.namespace()?,
        r.coord()?,
        r.coord()?,
        read_optional_u64(r)?,
    ))
}

/// Appends one change (its bytes are [`change_bytes`]).
pub fn put_change(b: &mut Vec<u8>, change: &WatchChange) {
    put_u64(b, change.lsn);
    let op = match &change.op {
        WatchOp::Put(_) => OP_PUT,
        WatchOp::Del => OP_DEL,
        WatchOp::Link { .. } => OP_LINK,
        WatchOp::Unlink { .. } => OP_UNLINK,
        WatchOp::ProgramPut(_) => OP_PROGRAM_PUT,
        WatchOp::ProgramDel => OP_PROGRAM_DEL,
    };
    b.push(op);
    put_coord(b, change.coord);
    match &change.op {
        WatchOp::Put(value) | WatchOp::ProgramPut(value) => put_blob(b, value),
        WatchOp::Del | WatchOp::ProgramDel => {}
        WatchOp::Link { to, label, weight } => {
            put_coord(b, *to);
            put_label(b, label);
            put_f64(b, *weight);
        }
        WatchOp::Unlink { to, label } => {
            put_coord(b, *to);
            put_label(b, label);
        }
    }
}

/// The bytes [`put_change`] appends for `change`.
pub fn change_bytes(change: &WatchChange) -> usize {
    MIN_CHANGE_BYTES
        + match &change.op {
            WatchOp::Put(value) | WatchOp::ProgramPut(value) => 4 + value.len(),
            WatchOp::Del | WatchOp::ProgramDel => 0,
            WatchOp::Link { label, .. } => 12 + 2 + label.as_str().len() + 8,
            WatchOp::Unlink { label, .. } => 12 + 2 + label.as_str().len(),
        }
}

fn read_change(r: &mut BodyReader<'_>, max_value_bytes: usize) -> Result<WatchChange, DecodeError> {
    let lsn = r.u64()?;
    let op_byte = r.u8()?;
    let coord = r.coord()?;
    let op = match op_byte {
        OP_PUT => WatchOp::Put(r.blob("value", max_value_bytes)?),
        OP_DEL => WatchOp::Del,
        OP_LINK => WatchOp::Link {
            to: r.coord()?,
            label: read_label(r)?,
            weight: read_f64(r)?,
        },
        OP_UNLINK => WatchOp::Unlink {
            to: r.coord()?,
            label: read_label(r)?,
        },
        OP_PROGRAM_PUT => WatchOp::ProgramPut(r.blob("program source", MAX_PROGRAM_BYTES)?),
        OP_PROGRAM_DEL => WatchOp::ProgramDel,
        other => {
            return Err(DecodeError::BadField {
                what: "watch change op",
                got: u64::from(other),
            });
        }
    };
    Ok(WatchChange { lsn, coord, op })
}

pub(crate) fn put_watch_frame(b: &mut Vec<u8>, frame: &WatchFrame) {
    match frame {
        WatchFrame::Started { next_lsn } => {
            b.push(FRAME_STARTED);
            put_u64(b, *next_lsn);
        }
        WatchFrame::Changes { more, changes } => {
            b.push(FRAME_CHANGES);
            b.push(if *more { CHANGES_FLAG_MORE } else { 0 });
            let changes = &changes[..changes.len().min(MAX_WATCH_FRAME_CHANGES as usize)];
            put_u32(b, changes.len() as u32);
            for change in changes {
                put_change(b, change);
            }
        }
        WatchFrame::Resync { lsn, reason } => {
            b.push(FRAME_RESYNC);
            put_u64(b, *lsn);
            b.push(*reason as u8);
        }
    }
}

pub(crate) fn read_watch_frame(
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<WatchFrame, DecodeError> {
    Ok(match r.u8()? {
        FRAME_STARTED => WatchFrame::Started { next_lsn: r.u64()? },
        FRAME_CHANGES => {
            let flags = r.flags(CHANGES_FLAG_MORE, "watch changes flags")?;
            let count = read_count(
                r,
                "watch change count",
                MAX_WATCH_FRAME_CHANGES,
                MIN_CHANGE_BYTES,
            )?;
            let mut changes = Vec::with_capacity(count);
            for _ in 0..count {
                changes.push(read_change(r, max_value_bytes)?);
            }
            WatchFrame::Changes {
                more: flags & CHANGES_FLAG_MORE != 0,
                changes,
            }
        }
        FRAME_RESYNC => {
            let lsn = r.u64()?;
            let raw = r.u8()?;
            let reason = ResyncReason::from_u8(raw).ok_or(DecodeError::BadField {
                what: "watch resync reason",
                got: u64::from(raw),
            })?;
            WatchFrame::Resync { lsn, reason }
        }
        other => {
            return Err(DecodeError::BadField {
                what: "watch frame kind",
                got: u64::from(other),
            });
        }
    })
}

/// Builds a `changes` frame change by change, cutting it where the next
/// change would pass `max_frame_bytes` or [`MAX_WATCH_FRAME_CHANGES`].
/// The bytes are exactly those of the [`crate::Response::Watch`] encoding.
pub struct WatchFrameEncoder {
    body: Vec<u8>,
    count: u32,
}

impl Default for WatchFrameEncoder {
    fn default() -> WatchFrameEncoder {
        WatchFrameEncoder::new()
    }
}

impl WatchFrameEncoder {
    /// Status, kind, flags and count before the first change.
    const PREFIX_BYTES: usize = 1 + 1 + 1 + 4;

    pub fn new() -> WatchFrameEncoder {
        let mut body = Vec::with_capacity(4096);
        body.extend_from_slice(&[0u8; Self::PREFIX_BYTES]);
        WatchFrameEncoder { body, count: 0 }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether `change` still fits a frame of `max_frame_bytes`.
    pub fn fits(&self, change: &WatchChange, max_frame_bytes: usize) -> bool {
        self.count == 0
            || (self.count < MAX_WATCH_FRAME_CHANGES
                && crate::HEADER_BYTES + self.body.len() + change_bytes(change) <= max_frame_bytes)
    }

    pub fn push(&mut self, change: &WatchChange) {
        put_change(&mut self.body, change);
        self.count += 1;
    }

    /// Appends the whole frame answering `request_id` to `out` and starts
    /// over empty.
    pub fn finish(&mut self, request_id: u64, more: bool, out: &mut Vec<u8>) {
        self.body[0] = 0; // status ok
        self.body[1] = FRAME_CHANGES;
        self.body[2] = if more { CHANGES_FLAG_MORE } else { 0 };
        self.body[3..7].copy_from_slice(&self.count.to_le_bytes());
        crate::frame::encode_frame(
            out,
            crate::Opcode::Watch as u16 | crate::frame::RESPONSE_BIT,
            request_id,
            |b| b.extend_from_slice(&self.body),
        );
        self.body.truncate(Self::PREFIX_BYTES);
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FrameHeader, HEADER_BYTES, Limits, Response};

    fn changes() -> Vec<WatchChange> {
        let label = EdgeLabel::new("road").unwrap();
        let at = Coord::new(1, -2, 3);
        vec![
            WatchChange {
                lsn: 7,
                coord: at,
                op: WatchOp::Put(b"hi".to_vec()),
            },
            WatchChange {
                lsn: 8,
                coord: at,
                op: WatchOp::Del,
            },
            WatchChange {
                lsn: 9,
                coord: at,
                op: WatchOp::Link {
                    to: Coord::new(0, 0, 0),
                    label: label.clone(),
                    weight: 2.5,
                },
            },
            WatchChange {
                lsn: 9,
                coord: at,
                op: WatchOp::Unlink {
                    to: Coord::new(0, 0, 0),
                    label,
                },
            },
            WatchChange {
                lsn: 10,
                coord: at,
                op: WatchOp::ProgramPut(b"return 1".to_vec()),
            },
            WatchChange {
                lsn: 11,
                coord: at,
                op: WatchOp::ProgramDel,
            },
        ]
    }

    fn decode(frame: &[u8]) -> Response {
        let header = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap());
        header.verify_body(&frame[HEADER_BYTES..]).unwrap();
        Response::decode(&header, &frame[HEADER_BYTES..], &Limits::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn streamed_frames_are_byte_identical_to_encode_and_sized_right() {
        let changes = changes();
        let mut encoder = WatchFrameEncoder::new();
        for change in &changes {
            encoder.push(change);
        }
        let mut streamed = Vec::new();
        encoder.finish(5, true, &mut streamed);
        let response = Response::Watch(WatchFrame::Changes {
            more: true,
            changes: changes.clone(),
        });
        let mut expected = Vec::new();
        response.encode(5, &mut expected);
        assert_eq!(streamed, expected);
        assert_eq!(decode(&expected), response);
        let sum: usize = changes.iter().map(change_bytes).sum();
        assert_eq!(
            expected.len(),
            HEADER_BYTES + WatchFrameEncoder::PREFIX_BYTES + sum
        );
        // The encoder starts over empty.
        let mut empty = Vec::new();
        encoder.finish(5, false, &mut empty);
        assert_eq!(
            decode(&empty),
            Response::Watch(WatchFrame::Changes {
                more: false,
                changes: Vec::new()
            })
        );
    }

    #[test]
    fn unknown_ops_kinds_and_reasons_are_refused() {
        for body in [
            vec![0u8, 9],
            vec![0, FRAME_RESYNC, 1, 0, 0, 0, 0, 0, 0, 0, 3],
            vec![0, FRAME_CHANGES, 2, 0, 0, 0, 0],
        ] {
            let mut frame = Vec::new();
            crate::frame::encode_frame(
                &mut frame,
                crate::Opcode::Watch as u16 | crate::frame::RESPONSE_BIT,
                1,
                |b| b.extend_from_slice(&body),
            );
            let header = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap());
            assert!(
                Response::decode(&header, &frame[HEADER_BYTES..], &Limits::default()).is_err(),
                "{body:?}"
            );
        }
    }
}
