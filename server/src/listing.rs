//! `edge-list` (0x0026) and `prog-list` (0x0043): every edge and every
//! program of a namespace, a page at a time, for `cubec export`.
//!
//! Served from the in-memory store on the connection's thread like `scan`,
//! never waiting on the writer. Each page is bounded by the request's
//! limit, the protocol's page caps and the frame, and examines a bounded
//! number of edge slots (`cube_store::listing`), so one page holds a lock
//! only briefly whatever the namespace holds.

use cube_protocol::{
    ErrorCode, MAX_EDGE_PAGE, MAX_PROGRAM_PAGE, NamespaceName, Request, Response, ServerError,
};
use cube_store::listing::{ListLimits, listed_edge_bytes};

use crate::connection::no_such_namespace;
use crate::server::Shared;

/// What a page's frame holds besides its entries: the header, the status
/// byte, the count and the largest cursor.
const PAGE_OVERHEAD_BYTES: usize = 20 + 1 + 4 + 1 + 12;

pub(crate) fn handle(shared: &Shared, request: Request) -> Result<Response, ServerError> {
    let mem = shared.engine.memstore();
    let entry_budget = (shared.args.max_frame_bytes as usize).saturating_sub(PAGE_OVERHEAD_BYTES);
    match request {
        Request::EdgeList { ns, limit, after } => {
            let limits = ListLimits {
                max_items: positive(limit, "edge-list")?.min(MAX_EDGE_PAGE) as usize,
                max_bytes: entry_budget,
                max_steps: ListLimits::MAX_STEPS,
            };
            let page = mem
                .edge_page(&ns, after, limits)
                .ok_or_else(|| no_such_namespace(&ns))?;
            // A page stops before a coordinate whose edges would overflow
            // it, but the first coordinate's always go in.
            let bytes: usize = page
                .edges
                .iter()
                .map(|e| listed_edge_bytes(e.label.as_str()))
                .sum();
            if bytes > entry_budget {
                return Err(too_big_for_a_frame(&ns, shared));
            }
            Ok(Response::EdgeList(page))
        }
        Request::ProgramList { ns, limit, after } => {
            let limits = ListLimits {
                max_items: positive(limit, "prog-list")?.min(MAX_PROGRAM_PAGE) as usize,
                max_bytes: entry_budget,
                max_steps: ListLimits::MAX_STEPS,
            };
            let page = mem
                .program_page(&ns, after, limits)
                .ok_or_else(|| no_such_namespace(&ns))?;
            Ok(Response::ProgramList(page))
        }
        other => Err(ServerError::new(
            ErrorCode::Internal,
            format!("{} reached the listing handler", other.opcode().name()),
        )),
    }
}

/// A page limit of 0 asks for nothing, which could never make progress.
fn positive(limit: u32, what: &str) -> Result<u32, ServerError> {
    if limit == 0 {
        return Err(ServerError::new(
            ErrorCode::InvalidArgument,
            format!("{what} limit is 0; ask for at least 1 entry per page"),
        ));
    }
    Ok(limit)
}

fn too_big_for_a_frame(ns: &NamespaceName, shared: &Shared) -> ServerError {
    ServerError::new(
        ErrorCode::LimitExceeded,
        format!(
            "the edges leaving one coordinate of {ns} do not fit in one frame of {} bytes \
             (cubed --max-frame-bytes); raise it to list them",
            shared.args.max_frame_bytes
        ),
    )
}
