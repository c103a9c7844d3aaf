//! `mget`: the values at many coordinates of one namespace in one request.
//!
//! Served from the in-memory store like `get`, never waiting on the writer:
//! `MemStore::read_cells` visits every coordinate under one hold of the
//! namespace's read lock, so the answer is one state of the store (no put
//! lands between two of its cells), and the store only ever holds applied,
//! durable writes. Each value is copied once, straight into the response
//! frame. The request decoder bounds the coordinates at
//! `MAX_MGET_CELLS`; the answer must also fit the frame limit, and one that
//! would not is refused whole (a clear `limit_exceeded`), never cut short.

use cube_protocol::{Coord, ErrorCode, MgetEncoder, NamespaceName, ServerError};
use cube_store::MemStore;

use crate::connection::no_such_namespace;

/// Encodes the answer to `mget ns coords` into `out` (cleared first), or
/// says why not: no such namespace, or an answer over `max_frame_bytes`.
/// On an error `out` is left empty.
pub(crate) fn answer(
    mem: &MemStore,
    ns: &NamespaceName,
    coords: &[Coord],
    request_id: u64,
    max_frame_bytes: u32,
    out: &mut Vec<u8>,
) -> Result<(), ServerError> {
    out.clear();
    let limit = u64::from(max_frame_bytes);
    let mut encoder = MgetEncoder::begin(out, request_id);
    // The whole answer's size, counted on past the limit so the error can
    // say how large it would have been.
    let mut needed = MgetEncoder::EMPTY_FRAME_BYTES as u64;
    let mut fits = needed <= limit;
    let found = mem.read_cells(ns, coords, |_, value| {
        let value = value.map(|v| &v[..]);
        needed += MgetEncoder::cell_bytes(value.map(<[u8]>::len)) as u64;
        if fits && needed <= limit {
            encoder.push(value);
        } else {
            // Stop copying; the partial frame is dropped below.
            fits = false;
        }
    });
    match found {
        None => {
            encoder.abandon();
            return Err(no_such_namespace(ns));
        }
        Some(Err(e)) => {
            encoder.abandon();
            return Err(crate::connection::read_failed(&e));
        }
        Some(Ok(())) => {}
    }
    if !fits {
        encoder.abandon();
        return Err(too_large(needed, limit, coords.len()));
    }
    encoder.finish();
    Ok(())
}

fn too_large(needed: u64, limit: u64, cells: usize) -> ServerError {
    ServerError::new(
        ErrorCode::LimitExceeded,
        format!(
            "the mget answer for {cells} cells would be {needed} bytes, over the frame limit of \
             {limit} bytes (cubed --max-frame-bytes); ask for fewer cells per request"
        ),
    )
}
