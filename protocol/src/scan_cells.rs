//! A scan response read in place: the page's cells borrowed from the frame
//! body ([`ScanCells`]) rather than copied into a `Vec` per value, for a
//! reader that looks at each cell once (a box of 64 000 cells is 64 000
//! allocations otherwise). [`Response::decode`] builds its owned page from
//! the same checked cells, so both accept exactly the same bodies.

use crate::edge::read_count;
use crate::error::DecodeError;
use crate::frame::{FrameHeader, Limits, Opcode, RESPONSE_BIT};
use crate::model::Coord;
use crate::response::{
    MAX_SCAN_PAGE_CELLS, MIN_SCAN_CELL_BYTES, Response, SCAN_KIND_CELLS, SCAN_KIND_COUNT,
    SCAN_KIND_WITH_LSN, ScanCell, ScanResult, ServerError, read_status,
};
use crate::wire::BodyReader;

/// The cells of one scan page, in curve order, borrowed from the body
/// they were decoded from; every cell was checked when the page was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanCells<'a> {
    /// `count` encoded cells (`coord`, then a `u32`-length value), exactly.
    bytes: &'a [u8],
    count: usize,
}

/// What a scan page carries, borrowed: a count, or the cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanResultRef<'a> {
    Count(u64),
    Cells(ScanCells<'a>),
}

/// A scan response page decoded in place (see [`decode_scan_page`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanPageRef<'a> {
    pub result: ScanResultRef<'a>,
    /// `None` when the box is finished; else where the next page starts.
    pub resume_after: Option<Coord>,
    /// The LSN the page is at, when the request asked for it.
    pub lsn: Option<u64>,
}

impl ScanPageRef<'_> {
    /// The page as an owned [`Response::Scan`], each value copied.
    pub fn to_response(&self) -> Response {
        let result = match self.result {
            ScanResultRef::Count(count) => ScanResult::Count(count),
            ScanResultRef::Cells(cells) => ScanResult::Cells(
                cells
                    .iter()
                    .map(|(coord, value)| ScanCell {
                        coord,
                        value: value.to_vec(),
                    })
                    .collect(),
            ),
        };
        Response::Scan {
            result,
            resume_after: self.resume_after,
            lsn: self.lsn,
        }
    }
}

impl<'a> ScanCells<'a> {
    /// Checks `count` (a `u32`, at most [`MAX_SCAN_PAGE_CELLS`]) and that
    /// many cells, each value at most `max_value_bytes`.
    pub(crate) fn read(
        r: &mut BodyReader<'a>,
        max_value_bytes: usize,
    ) -> Result<ScanCells<'a>, DecodeError> {
        let count = read_count(
            r,
            "scan page cell count",
            MAX_SCAN_PAGE_CELLS,
            MIN_SCAN_CELL_BYTES,
        )?;
        let start = r.offset();
        for _ in 0..count {
            r.coord()?;
            r.blob_ref("value", max_value_bytes)?;
        }
        Ok(ScanCells {
            bytes: r.since(start),
            count,
        })
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded cells, as they are on the wire.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn iter(&self) -> ScanCellsIter<'a> {
        ScanCellsIter {
            bytes: self.bytes,
            left: self.count,
        }
    }
}

impl<'a> IntoIterator for ScanCells<'a> {
    type Item = (Coord, &'a [u8]);
    type IntoIter = ScanCellsIter<'a>;

    fn into_iter(self) -> ScanCellsIter<'a> {
        self.iter()
    }
}

/// The cells of a [`ScanCells`], each a coordinate and its value.
#[derive(Clone, Debug)]
pub struct ScanCellsIter<'a> {
    bytes: &'a [u8],
    left: usize,
}

impl<'a> Iterator for ScanCellsIter<'a> {
    type Item = (Coord, &'a [u8]);

    fn next(&mut self) -> Option<(Coord, &'a [u8])> {
        if self.left == 0 {
            return None;
        }
        match split_scan_cell(self.bytes) {
            Some((coord, value, rest)) => {
                self.bytes = rest;
                self.left -= 1;
                Some((coord, value))
            }
            // Not reached: the cells were checked when the page was read.
            None => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for ScanCellsIter<'_> {}

/// Reads the first encoded scan cell of `bytes` (`x`, `y`, `z` as `i32`,
/// a `u32` length, the value): its coordinate, its value and the bytes
/// after it; `None` if `bytes` is shorter than the cell says. For a reader
/// that walks a checked page ([`ScanCells::as_bytes`]) by offset.
pub fn split_scan_cell(bytes: &[u8]) -> Option<(Coord, &[u8], &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<16>()?;
    let field = |at: usize| [head[at], head[at + 1], head[at + 2], head[at + 3]];
    let coord = Coord::new(
        i32::from_le_bytes(field(0)),
        i32::from_le_bytes(field(4)),
        i32::from_le_bytes(field(8)),
    );
    let len = usize::try_from(u32::from_le_bytes(field(12))).ok()?;
    let (value, rest) = rest.split_at_checked(len)?;
    Some((coord, value, rest))
}

/// Decodes a scan response frame's body in place: `Ok(Err)` for the
/// server's error answer, as [`Response::decode`] gives it. A frame that is
/// not a scan response is a decode error, so check the opcode first when
/// another answer is possible. Accepts exactly the bodies
/// [`Response::decode`] accepts for a scan response.
pub fn decode_scan_page<'a>(
    header: &FrameHeader,
    body: &'a [u8],
    limits: &Limits,
) -> Result<Result<ScanPageRef<'a>, ServerError>, DecodeError> {
    let mut r = BodyReader::new(body);
    if let Some(error) = read_status(&mut r)? {
        return Ok(Err(error));
    }
    let scan_response = Opcode::Scan as u16 | RESPONSE_BIT;
    if header.opcode != scan_response {
        return Err(DecodeError::BadField {
            what: "opcode of a scan response",
            got: u64::from(header.opcode),
        });
    }
    let page = read_scan_page_ref(&mut r, limits.max_value_bytes as usize)?;
    r.finish()?;
    Ok(Ok(page))
}

/// A scan page's fields after the status: the kind (with the LSN flag),
/// the LSN, the count or the cells, then the resume cursor.
pub(crate) fn read_scan_page_ref<'a>(
    r: &mut BodyReader<'a>,
    max_value_bytes: usize,
) -> Result<ScanPageRef<'a>, DecodeError> {
    let kind = r.u8()?;
    let lsn = if kind & SCAN_KIND_WITH_LSN != 0 {
        Some(r.u64()?)
    } else {
        None
    };
    let result = match kind & !SCAN_KIND_WITH_LSN {
        SCAN_KIND_COUNT => ScanResultRef::Count(r.u64()?),
        SCAN_KIND_CELLS => ScanResultRef::Cells(ScanCells::read(r, max_value_bytes)?),
        other => {
            return Err(DecodeError::BadField {
                what: "scan result kind",
                got: u64::from(other),
            });
        }
    };
    Ok(ScanPageRef {
        result,
        resume_after: r.optional_coord()?,
        lsn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::frame::split_frame;

    fn limits(max_value_bytes: u32) -> Limits {
        Limits {
            max_frame_bytes: 1 << 20,
            max_value_bytes,
        }
    }

    fn page(cells: usize) -> Vec<ScanCell> {
        (0..cells)
            .map(|i| ScanCell {
                coord: Coord::new(i as i32, -(i as i32), 7),
                value: vec![i as u8; i % 5],
            })
            .collect()
    }

    #[test]
    fn borrowed_pages_decode_as_the_owned_ones() {
        for result in [
            ScanResult::Cells(page(0)),
            ScanResult::Cells(page(1)),
            ScanResult::Cells(page(300)),
            ScanResult::Count(12),
        ] {
            for (resume_after, lsn) in [(None, None), (Some(Coord::new(1, 2, 3)), Some(9))] {
                let response = Response::Scan {
                    result: result.clone(),
                    resume_after,
                    lsn,
                };
                let mut frame = Vec::new();
                response.encode(5, &mut frame);
                let (header, body) = split_frame(&frame);
                let page = decode_scan_page(&header, body, &limits(16))
                    .unwrap()
                    .unwrap();
                if let ScanResultRef::Cells(cells) = page.result {
                    assert_eq!(cells.iter().len(), cells.len());
                    assert_eq!(cells.iter().count(), cells.len());
                }
                assert_eq!(page.to_response(), response);
            }
        }
    }

    #[test]
    fn bad_pages_are_refused_by_both_decoders_alike() {
        let response = Response::Scan {
            result: ScanResult::Cells(page(10)),
            resume_after: None,
            lsn: None,
        };
        let mut frame = Vec::new();
        response.encode(5, &mut frame);
        let (header, body) = split_frame(&frame);
        let both = |body: &[u8], max_value_bytes: u32| {
            let whole = Response::decode(&header, body, &limits(max_value_bytes));
            let borrowed = decode_scan_page(&header, body, &limits(max_value_bytes));
            match (whole, borrowed) {
                (Err(a), Err(b)) => {
                    assert_eq!(a, b);
                    Some(a)
                }
                (Ok(Ok(a)), Ok(Ok(b))) => {
                    assert_eq!(a, b.to_response());
                    None
                }
                (a, b) => panic!("decoders disagree: {a:?} / {b:?}"),
            }
        };
        assert_eq!(both(body, 16), None);
        // Every cut is refused, never a panic.
        for cut in 0..body.len() {
            assert!(both(&body[..cut], 16).is_some(), "cut at {cut}");
        }
        // A value over the limit (values of up to 4 bytes here).
        assert!(matches!(
            both(body, 3),
            Some(DecodeError::TooLarge { what: "value", .. })
        ));
        let mut longer = body.to_vec();
        longer.push(0);
        assert_eq!(
            both(&longer, 16),
            Some(DecodeError::TrailingBytes { trailing: 1 })
        );
        // A count over the page limit.
        let mut many = body.to_vec();
        many[2..6].copy_from_slice(&(MAX_SCAN_PAGE_CELLS + 1).to_le_bytes());
        assert!(matches!(both(&many, 16), Some(DecodeError::TooMany { .. })));
    }

    #[test]
    fn errors_and_other_answers() {
        let error = ServerError {
            code: ErrorCode::NoSuchNamespace as u16,
            message: "no namespace x".to_owned(),
        };
        let mut frame = Vec::new();
        Response::encode_error(Opcode::Scan as u16, 3, &error, &mut frame);
        let (header, body) = split_frame(&frame);
        assert_eq!(
            decode_scan_page(&header, body, &limits(16)).unwrap(),
            Err(error)
        );
        let mut frame = Vec::new();
        Response::Mget(vec![None]).encode(3, &mut frame);
        let (header, body) = split_frame(&frame);
        assert!(matches!(
            decode_scan_page(&header, body, &limits(16)),
            Err(DecodeError::BadField { .. })
        ));
    }

    #[test]
    fn split_scan_cell_reads_one_cell_or_nothing() {
        let mut bytes = Vec::new();
        for field in [1i32, -2, 3] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        bytes.extend_from_slice(&2u32.to_le_bytes());
        bytes.extend_from_slice(b"abX");
        assert_eq!(
            split_scan_cell(&bytes),
            Some((Coord::new(1, -2, 3), &b"ab"[..], &b"X"[..]))
        );
        assert_eq!(split_scan_cell(&bytes[..17]), None);
        assert_eq!(split_scan_cell(&bytes[..15]), None);
    }
}
