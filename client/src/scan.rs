//! [`Client`] methods for region reads: a page at a time
//! ([`Client::scan_page`]), every cell of a box as owned cells
//! ([`Client::scan`]) or page by page borrowed from the answer
//! ([`Client::scan_pages`], no allocation per cell), and counts
//! ([`Client::scan_count`]).

use cube_protocol::{
    CellBox, Coord, FrameHeader, MAX_SCAN_PAGE_CELLS, Opcode, ProtocolError, Request, Response,
    ScanCell, ScanCells, ScanPageRef, ScanResult, ScanResultRef, decode_scan_page,
    frame::RESPONSE_BIT, split_scan_cell,
};

use crate::client::{Client, answer_to, namespace, unexpected};
use crate::error::ClientError;

impl Client {
    /// One page of the cells inside `region`, in the namespace's curve
    /// order: at most `limit` cells (the server caps pages at
    /// [`MAX_SCAN_PAGE_CELLS`]), starting strictly after `after` (a previous
    /// page's [`ScanPage::resume_after`]) or at the start of the box.
    pub fn scan_page(
        &mut self,
        ns: &str,
        region: &CellBox,
        limit: u32,
        after: Option<Coord>,
    ) -> Result<ScanPage, ClientError> {
        match self.scan_request(ns, region, limit.max(1), false, after)? {
            (ScanResult::Cells(cells), resume_after) => Ok(ScanPage {
                cells,
                resume_after,
            }),
            (ScanResult::Count(_), _) => Err(values_expected()),
        }
    }

    /// Every cell inside `region`, following cursors page by page (pages of
    /// `page_cells`; memory stays one page however large the box). Each
    /// value is its own `Vec`; [`Client::scan_pages`] lends them instead.
    pub fn scan(&mut self, ns: &str, region: CellBox, page_cells: u32) -> ScanIter<'_> {
        ScanIter {
            pages: self.scan_pages(ns, region, page_cells),
            at: 0,
            end: 0,
            left: 0,
        }
    }

    /// Every cell inside `region`, a page (of up to `page_cells`) at a
    /// time, each page's cells borrowed from the answer as it arrived: no
    /// allocation per cell. See [`ScanPages::next_page`].
    pub fn scan_pages(&mut self, ns: &str, region: CellBox, page_cells: u32) -> ScanPages<'_> {
        ScanPages {
            client: self,
            ns: ns.to_owned(),
            region,
            page_cells: page_cells.clamp(1, MAX_SCAN_PAGE_CELLS),
            after: None,
            finished: false,
        }
    }

    /// How many cells `region` holds, summing pages until the box is done.
    /// Work on the server is proportional to the cells present, so this is
    /// cheap even for the whole coordinate space of a small store.
    pub fn scan_count(&mut self, ns: &str, region: &CellBox) -> Result<u64, ClientError> {
        let mut total = 0u64;
        let mut after = None;
        loop {
            match self.scan_request(ns, region, 1, true, after)? {
                (ScanResult::Count(n), resume_after) => {
                    total += n;
                    match resume_after {
                        None => return Ok(total),
                        Some(next) => after = Some(check_progress(after, next)?),
                    }
                }
                (ScanResult::Cells(_), _) => {
                    return Err(ClientError::UnexpectedResponse(
                        "cells in answer to a count-only scan".to_owned(),
                    ));
                }
            }
        }
    }

    fn scan_request(
        &mut self,
        ns: &str,
        region: &CellBox,
        limit: u32,
        count_only: bool,
        after: Option<Coord>,
    ) -> Result<(ScanResult, Option<Coord>), ClientError> {
        let request = Request::Scan {
            ns: namespace(ns)?,
            lo: region.lo(),
            hi: region.hi(),
            limit,
            count_only,
            after,
            with_lsn: false,
        };
        match self.call(&request)? {
            Response::Scan {
                result,
                resume_after,
                ..
            } => Ok((result, resume_after)),
            other => Err(unexpected("scan", &other)),
        }
    }

    /// One page of values, read in place from the answer's frame.
    fn scan_page_in_place(&mut self, request: &Request) -> Result<ScanPageRef<'_>, ClientError> {
        let (header, request_id) = self.call_in_place(request)?;
        let limits = self.answer_limits();
        let (body, mut mark) = self.answer_in_place();
        let page = page_answer(request, request_id, &header, body, &limits);
        mark.note(&page);
        page
    }
}

/// The page a scan for values was answered with; any other answer (an
/// error, a count, another request's answer) is an error.
fn page_answer<'a>(
    request: &Request,
    request_id: u64,
    header: &FrameHeader,
    body: &'a [u8],
    limits: &cube_protocol::Limits,
) -> Result<ScanPageRef<'a>, ClientError> {
    let decode_error = |e| ClientError::Protocol(ProtocolError::Decode(e));
    if header.opcode != Opcode::Scan as u16 | RESPONSE_BIT || header.request_id != request_id {
        // Not this scan's page: say what it is, as any call would.
        let outcome = Response::decode(header, body, limits).map_err(decode_error)?;
        return match answer_to(request, request_id, header, outcome) {
            Ok(other) => Err(unexpected("scan", &other)),
            Err(e) => Err(e),
        };
    }
    match decode_scan_page(header, body, limits).map_err(decode_error)? {
        Ok(page) if matches!(page.result, ScanResultRef::Cells(_)) => Ok(page),
        Ok(_) => Err(values_expected()),
        Err(server_error) => Err(ClientError::Server(server_error)),
    }
}

fn values_expected() -> ClientError {
    ClientError::UnexpectedResponse("a count answer to a scan for values".to_owned())
}

/// One page of a region read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanPage {
    /// Cells in the namespace's curve order.
    pub cells: Vec<ScanCell>,
    /// `None` when the box is finished; otherwise pass it as `after` to get
    /// the next page (which may be short, even empty).
    pub resume_after: Option<Coord>,
}

/// The pages of a box, fetched one per [`ScanPages::next_page`]; see
/// [`Client::scan_pages`].
pub struct ScanPages<'a> {
    client: &'a mut Client,
    ns: String,
    region: CellBox,
    page_cells: u32,
    after: Option<Coord>,
    finished: bool,
}

impl ScanPages<'_> {
    /// The next page's cells in curve order (a page may be empty while the
    /// box is not finished), borrowed until the next call; `Ok(None)` once
    /// the box is finished. After an error, `Ok(None)`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cube_client::ClientError> {
    /// # let mut client = cube_client::Client::connect("/tmp/cubed.sock")?;
    /// use cube_client::{CellBox, ClientError, Coord};
    /// let region = CellBox::new(Coord::new(0, 0, 0), Coord::new(39, 39, 39))
    ///     .map_err(ClientError::BadArgument)?;
    /// let mut bytes = 0;
    /// let mut pages = client.scan_pages("default", region, cube_client::MAX_SCAN_PAGE_CELLS);
    /// while let Some(cells) = pages.next_page()? {
    ///     for (_coord, value) in cells {
    ///         bytes += value.len();
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn next_page(&mut self) -> Result<Option<ScanCells<'_>>, ClientError> {
        Ok(self.next_page_ref()?.map(|page| cells_of(&page)))
    }

    /// Where the next page would start: `None` before the first page, or
    /// after the last one.
    pub fn cursor(&self) -> Option<Coord> {
        self.after
    }

    /// The next page whole (its cells and cursor), cursors followed.
    fn next_page_ref(&mut self) -> Result<Option<ScanPageRef<'_>>, ClientError> {
        if self.finished {
            return Ok(None);
        }
        // Ended unless the page comes and its cursor moves on.
        self.finished = true;
        let request = Request::Scan {
            ns: namespace(&self.ns)?,
            lo: self.region.lo(),
            hi: self.region.hi(),
            limit: self.page_cells,
            count_only: false,
            after: self.after,
            with_lsn: false,
        };
        let page = self.client.scan_page_in_place(&request)?;
        self.after = match page.resume_after {
            Some(next) => {
                let next = check_progress(self.after, next)?;
                self.finished = false;
                Some(next)
            }
            None => None,
        };
        Ok(Some(page))
    }
}

/// A value page's cells (a count page, refused by `page_answer`, has none).
fn cells_of<'a>(page: &ScanPageRef<'a>) -> ScanCells<'a> {
    match page.result {
        ScanResultRef::Cells(cells) => cells,
        ScanResultRef::Count(_) => ScanCells::default(),
    }
}

/// The cells of a box, fetched a page at a time as the iteration goes; see
/// [`Client::scan`]. Yields an error (once) if a page fails, then ends.
pub struct ScanIter<'a> {
    pages: ScanPages<'a>,
    /// The current page's cells not yet yielded: bytes `at..end` of the
    /// client's answer buffer, `left` cells.
    at: usize,
    end: usize,
    left: usize,
}

impl ScanIter<'_> {
    /// Where the next page would start: `None` before the first page, or
    /// after the last one.
    pub fn cursor(&self) -> Option<Coord> {
        self.pages.cursor()
    }

    /// The next cell of the current page, copied out of the answer.
    fn next_in_page(&mut self) -> Option<ScanCell> {
        if self.left == 0 {
            return None;
        }
        let body = self.pages.client.answer_body();
        let cell = split_scan_cell(body.get(self.at..self.end).unwrap_or_default());
        let Some((coord, value, rest)) = cell else {
            // Not reached: the page was checked when it was read.
            self.left = 0;
            return None;
        };
        self.at = self.end - rest.len();
        self.left -= 1;
        Some(ScanCell {
            coord,
            value: value.to_vec(),
        })
    }
}

impl Iterator for ScanIter<'_> {
    type Item = Result<ScanCell, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(cell) = self.next_in_page() {
                return Some(Ok(cell));
            }
            let page = match self.pages.next_page_ref() {
                Ok(Some(page)) => page,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            // The cells are followed by the cursor (a flag byte, then the
            // coordinate when there is one) and nothing else.
            let cursor_bytes = if page.resume_after.is_some() { 13 } else { 1 };
            let cells = cells_of(&page);
            let (cells_bytes, count) = (cells.as_bytes().len(), cells.len());
            let body_bytes = self.pages.client.answer_body().len();
            self.end = body_bytes.saturating_sub(cursor_bytes);
            self.at = self.end.saturating_sub(cells_bytes);
            self.left = count;
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // The rest of this page at least; a collect reserves a page at once.
        (self.left, None)
    }
}

/// A server that hands back the same cursor twice would make a client loop
/// forever; say so instead.
fn check_progress(previous: Option<Coord>, next: Coord) -> Result<Coord, ClientError> {
    if previous == Some(next) {
        return Err(ClientError::UnexpectedResponse(format!(
            "scan cursor did not move past {next}"
        )));
    }
    Ok(next)
}
