//! Answers built in place, straight from the store: a scan page
//! ([`ScanPageEncoder`]) and an `mget` answer ([`MgetEncoder`]), each value
//! copied once, into the frame. Their bytes are exactly those of
//! [`Response::encode`] for the same answer.

use crate::PROTOCOL_VERSION;
use crate::frame::{FrameHeader, HEADER_BYTES, Opcode, RESPONSE_BIT};
use crate::model::Coord;
#[cfg(doc)]
use crate::request::MAX_MGET_CELLS;
#[cfg(doc)]
use crate::response::{MAX_SCAN_PAGE_CELLS, Response};
use crate::response::{SCAN_KIND_CELLS, SCAN_KIND_WITH_LSN, STATUS_OK};
use crate::wire::{put_blob, put_optional_coord, put_u32, put_u64};

/// Builds a scan response frame with values cell by cell, straight from
/// the store, so a page of thousands of cells costs no per-cell allocation.
/// The bytes are exactly those of [`Response::encode`] for the same page.
pub struct ScanPageEncoder<'a> {
    out: &'a mut Vec<u8>,
    frame: CountedFrame,
    cells: u32,
}

impl<'a> ScanPageEncoder<'a> {
    /// Starts the frame answering `request_id` at the end of `out`.
    pub fn begin(out: &'a mut Vec<u8>, request_id: u64) -> ScanPageEncoder<'a> {
        ScanPageEncoder::begin_at(out, request_id, None)
    }

    /// [`Self::begin`], the page saying it is at `lsn` when given.
    pub fn begin_at(
        out: &'a mut Vec<u8>,
        request_id: u64,
        lsn: Option<u64>,
    ) -> ScanPageEncoder<'a> {
        let mut prefix = Vec::with_capacity(9);
        match lsn {
            None => prefix.push(SCAN_KIND_CELLS),
            Some(lsn) => {
                prefix.push(SCAN_KIND_CELLS | SCAN_KIND_WITH_LSN);
                put_u64(&mut prefix, lsn);
            }
        }
        let frame = CountedFrame::begin(out, request_id, &prefix);
        ScanPageEncoder {
            out,
            frame,
            cells: 0,
        }
    }

    /// The frame's size if it were finished now (counting the largest
    /// cursor [`Self::finish`] can add).
    pub fn frame_bytes(&self) -> usize {
        self.out.len() - self.frame.start + 1 + 12
    }

    /// The bytes one more cell with a value of `value_len` bytes adds.
    pub fn cell_bytes(value_len: usize) -> usize {
        12 + 4 + value_len
    }

    pub fn cells(&self) -> u32 {
        self.cells
    }

    /// Makes room, once, for `cells` more cells with values of `value_len`
    /// bytes, but never for a frame over `max_frame_bytes`: a page grown
    /// by doubling copies itself several times and touches fresh pages of
    /// memory at each step (a third of a 64 k-cell page's time).
    pub fn reserve(&mut self, cells: usize, value_len: usize, max_frame_bytes: usize) {
        let frame = self.out.len() - self.frame.start;
        let wanted = frame
            .saturating_add(cells.saturating_mul(Self::cell_bytes(value_len)))
            .saturating_add(1 + 12)
            .min(max_frame_bytes);
        self.out.reserve(wanted.saturating_sub(frame));
    }

    /// Appends one cell. Callers keep pages within [`MAX_SCAN_PAGE_CELLS`]
    /// and the frame limit (see [`Self::frame_bytes`]).
    #[inline]
    pub fn push(&mut self, coord: Coord, value: &[u8]) {
        // The coordinate and the length as one 16-byte write: one capacity
        // check instead of four.
        let mut head = [0u8; 16];
        head[0..4].copy_from_slice(&coord.x.to_le_bytes());
        head[4..8].copy_from_slice(&coord.y.to_le_bytes());
        head[8..12].copy_from_slice(&coord.z.to_le_bytes());
        head[12..16].copy_from_slice(&(value.len() as u32).to_le_bytes());
        self.out.reserve(head.len() + value.len());
        self.out.extend_from_slice(&head);
        self.out.extend_from_slice(value);
        self.cells += 1;
    }

    /// Writes the cursor, the cell count and the header.
    pub fn finish(self, resume_after: Option<Coord>) {
        put_optional_coord(self.out, resume_after);
        self.frame.seal(self.out, self.cells, Opcode::Scan);
    }

    /// Drops the partial frame, leaving `out` as it was before
    /// [`Self::begin`] (a page that failed part way: an error goes instead).
    pub fn abandon(self) {
        self.out.truncate(self.frame.start);
    }
}

/// A successful response frame encoded in place at the end of a buffer
/// (by [`ScanPageEncoder`] and [`MgetEncoder`]), whose item count and
/// header are filled in once the items are known.
struct CountedFrame {
    /// Where the frame (its header) starts in the buffer.
    start: usize,
    /// Where its `u32` item count goes.
    count_at: usize,
    request_id: u64,
}

impl CountedFrame {
    /// Appends room for the header, the OK status, `prefix` (fields that
    /// come before the count) and room for the count.
    fn begin(out: &mut Vec<u8>, request_id: u64, prefix: &[u8]) -> CountedFrame {
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER_BYTES]);
        out.push(STATUS_OK);
        out.extend_from_slice(prefix);
        let count_at = out.len();
        put_u32(out, 0);
        CountedFrame {
            start,
            count_at,
            request_id,
        }
    }

    /// Writes the item count, then the header with the body's length and
    /// CRC.
    fn seal(&self, out: &mut [u8], count: u32, opcode: Opcode) {
        out[self.count_at..self.count_at + 4].copy_from_slice(&count.to_le_bytes());
        let body = &out[self.start + HEADER_BYTES..];
        let header = FrameHeader {
            body_len: body.len() as u32,
            body_crc32c: crc32c::crc32c(body),
            version: PROTOCOL_VERSION,
            opcode: opcode as u16 | RESPONSE_BIT,
            request_id: self.request_id,
        };
        out[self.start..self.start + HEADER_BYTES].copy_from_slice(&header.to_bytes());
    }
}

/// One cell of an `mget` answer: a presence byte, then the value as a blob
/// if it is 1.
pub(crate) fn put_mget_cell(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            put_blob(out, v);
        }
    }
}

/// Builds an `mget` answer frame value by value, straight from the store,
/// so each value is copied once (into the frame). The bytes are exactly
/// those of [`Response::encode`] for the same values.
pub struct MgetEncoder<'a> {
    out: &'a mut Vec<u8>,
    frame: CountedFrame,
    cells: u32,
}

impl<'a> MgetEncoder<'a> {
    /// Starts the frame answering `request_id` at the end of `out`.
    pub fn begin(out: &'a mut Vec<u8>, request_id: u64) -> MgetEncoder<'a> {
        let frame = CountedFrame::begin(out, request_id, &[]);
        MgetEncoder {
            out,
            frame,
            cells: 0,
        }
    }

    /// The frame's size so far (header included); it is the finished size.
    pub fn frame_bytes(&self) -> usize {
        self.out.len() - self.frame.start
    }

    /// The size of a frame holding no cell yet.
    pub const EMPTY_FRAME_BYTES: usize = HEADER_BYTES + 1 + 4;

    /// The bytes one more cell adds: a value of `value_len` bytes, or a
    /// missing one (`None`).
    pub fn cell_bytes(value_len: Option<usize>) -> usize {
        match value_len {
            None => 1,
            Some(len) => 1 + 4 + len,
        }
    }

    pub fn cells(&self) -> u32 {
        self.cells
    }

    /// Appends one cell. Callers keep answers within [`MAX_MGET_CELLS`]
    /// cells and the frame limit (see [`Self::cell_bytes`]).
    pub fn push(&mut self, value: Option<&[u8]>) {
        put_mget_cell(self.out, value);
        self.cells += 1;
    }

    /// Writes the cell count and the header.
    pub fn finish(self) {
        self.frame.seal(self.out, self.cells, Opcode::Mget);
    }

    /// Drops the partial frame, leaving `out` as it was before [`Self::begin`].
    pub fn abandon(self) {
        self.out.truncate(self.frame.start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Limits, split_frame};
    use crate::response::{Response, ScanCell, ScanResult};

    #[test]
    fn streamed_page_is_byte_identical_to_encode() {
        let cells = vec![
            ScanCell {
                coord: Coord::new(1, 2, 3),
                value: b"abc".to_vec(),
            },
            ScanCell {
                coord: Coord::new(-1, 0, 7),
                value: Vec::new(),
            },
        ];
        for (resume_after, lsn) in [(None, None), (Some(Coord::new(-1, 0, 7)), Some(42))] {
            let response = Response::Scan {
                result: ScanResult::Cells(cells.clone()),
                resume_after,
                lsn,
            };
            let mut expected = Vec::new();
            response.encode(77, &mut expected);
            let mut streamed = vec![9u8; 5];
            let mut encoder = ScanPageEncoder::begin_at(&mut streamed, 77, lsn);
            // Room made up front changes nothing in the bytes.
            encoder.reserve(cells.len(), 3, 1 << 20);
            for cell in &cells {
                encoder.push(cell.coord, &cell.value);
            }
            let predicted = encoder.frame_bytes();
            encoder.finish(resume_after);
            assert_eq!(&streamed[5..], &expected[..]);
            assert!(predicted >= expected.len());
            let (header, body) = split_frame(&expected);
            assert_eq!(
                Response::decode(&header, body, &Limits::default()).unwrap(),
                Ok(response)
            );
        }
    }

    #[test]
    fn mget_response_round_trips_and_streams_identically() {
        let values = vec![
            Some(b"abc".to_vec()),
            None,
            Some(Vec::new()),
            Some(vec![0xff, 0x00]),
            None,
        ];
        for values in [values, Vec::new()] {
            let response = Response::Mget(values.clone());
            let mut expected = Vec::new();
            response.encode(77, &mut expected);
            let (header, body) = split_frame(&expected);
            assert_eq!(
                Response::decode(&header, body, &Limits::default()).unwrap(),
                Ok(response)
            );

            let mut streamed = vec![9u8; 3];
            let mut encoder = MgetEncoder::begin(&mut streamed, 77);
            assert_eq!(encoder.frame_bytes(), MgetEncoder::EMPTY_FRAME_BYTES);
            let mut predicted = MgetEncoder::EMPTY_FRAME_BYTES;
            for value in &values {
                predicted += MgetEncoder::cell_bytes(value.as_ref().map(Vec::len));
                encoder.push(value.as_deref());
                assert_eq!(encoder.frame_bytes(), predicted);
            }
            assert_eq!(encoder.cells() as usize, values.len());
            encoder.finish();
            assert_eq!(&streamed[3..], &expected[..]);
            assert_eq!(predicted, expected.len());
        }
        // An abandoned frame leaves nothing behind.
        let mut out = vec![1u8, 2];
        let mut encoder = MgetEncoder::begin(&mut out, 1);
        encoder.push(Some(b"x"));
        encoder.abandon();
        assert_eq!(out, vec![1, 2]);
    }
}
