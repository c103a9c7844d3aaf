//! The edge commands: `link`, `unlink`, `edges`, `walk`, `path` and
//! `detach` (protocol opcodes 0x0020-0x0025).
//!
//! Reads (`edges`, `walk`, `path`) are served from the in-memory store on
//! the connection's thread, like `get`, never waiting on the writer, within
//! the `--max-walk-*` limits. Writes go to the writer: `unlink` as a plain
//! write; `link` and `detach` as transactions, because each must read the
//! latest state (earlier writes of the same group included) in the same
//! step as it writes: `link` to hold every coordinate to
//! `--max-edges-per-cell`, `detach` to list exactly the edges it removes,
//! so that the value and every incident edge go in one atomic record.

use cube_protocol::{
    Coord, Direction, EdgeLabel, EdgeWeight, ErrorCode, MAX_EDGE_LIST, NamespaceName, Request,
    Response, ServerError,
};
use cube_store::{EdgeKey, MemStore, Mutation, PathError, WalkLimits, WriteSession};

use crate::config::Args;
use crate::connection::{no_such_namespace, write_error};
use crate::server::Shared;

/// The encoded size of one `edges` entry at its largest: direction,
/// coordinate, a 64-byte label and the weight.
const MAX_EDGE_ENTRY_BYTES: usize = 1 + 12 + 2 + 64 + 8;

/// Answers one edge request. `session` is the connection's handle to the
/// writer (`None` once shutdown began); reads do not use it.
pub(crate) fn handle(
    shared: &Shared,
    session: Option<&WriteSession>,
    request: Request,
) -> Result<Response, ServerError> {
    let args = &shared.args;
    let mem = shared.engine.memstore();
    match request {
        Request::Link {
            ns,
            from,
            to,
            label,
            weight,
        } => link(session, args, ns, EdgeKey::new(from, to, label), weight),
        Request::Unlink {
            ns,
            from,
            to,
            label,
        } => unlink(session, ns, EdgeKey::new(from, to, label)),
        Request::Detach { ns, coord } => detach(session, ns, coord),
        Request::Edges {
            ns,
            coord,
            direction,
            label,
        } => edges(mem, args, ns, coord, direction, label),
        Request::Walk {
            ns,
            from,
            direction,
            label,
            max_depth,
            max_nodes,
            with_values,
        } => {
            let limits = requested_limits(args, max_depth, max_nodes)?;
            let walk = mem
                .walk(&ns, from, direction, label.as_ref(), with_values, limits)
                .ok_or_else(|| no_such_namespace(&ns))?
                .map_err(|e| crate::connection::read_failed(&e))?;
            Ok(Response::Walk(walk))
        }
        Request::Path {
            ns,
            from,
            to,
            label,
            max_cost,
        } => path(mem, args, ns, from, to, label, max_cost),
        other => Err(ServerError::new(
            ErrorCode::Internal,
            format!("{} reached the edge handler", other.opcode().name()),
        )),
    }
}

fn unlink(
    session: Option<&WriteSession>,
    ns: NamespaceName,
    edge: EdgeKey,
) -> Result<Response, ServerError> {
    let ack = writer(session)?
        .write(Mutation::Unlink { ns, edge })
        .map_err(|e| write_error(&e))?;
    Ok(Response::Unlink {
        lsn: ack.lsn,
        existed: ack.existed,
    })
}

/// The edges at `coord`, refused when more than one answer frame holds.
fn edges(
    mem: &MemStore,
    args: &Args,
    ns: NamespaceName,
    coord: Coord,
    direction: Direction,
    label: Option<EdgeLabel>,
) -> Result<Response, ServerError> {
    let fits = (args.max_frame_bytes as usize).saturating_sub(64) / MAX_EDGE_ENTRY_BYTES;
    let limit = fits.min(MAX_EDGE_LIST as usize);
    let edges = mem
        .edges(&ns, coord, direction, label.as_ref(), limit + 1)
        .ok_or_else(|| no_such_namespace(&ns))?;
    if edges.len() > limit {
        return Err(ServerError::new(
            ErrorCode::LimitExceeded,
            format!(
                "{coord} has more than {limit} edges in direction {}, more than one answer \
                 frame holds (cubed --max-frame-bytes); ask for --out or --in or one --label",
                direction.name()
            ),
        ));
    }
    Ok(Response::Edges(edges))
}

/// The cheapest path from `from` to `to` within `max_cost` and the server's walk
/// limits.
fn path(
    mem: &MemStore,
    args: &Args,
    ns: NamespaceName,
    from: Coord,
    to: Coord,
    label: Option<EdgeLabel>,
    max_cost: f64,
) -> Result<Response, ServerError> {
    if max_cost.is_nan() || max_cost < 0.0 {
        return Err(ServerError::new(
            ErrorCode::InvalidArgument,
            format!("path max_cost {max_cost} must be a number >= 0 (+inf: no bound)"),
        ));
    }
    let limits = args.walk_limits();
    let outcome = mem
        .path(&ns, from, to, label.as_ref(), max_cost, limits)
        .ok_or_else(|| no_such_namespace(&ns))?
        .map_err(|e| path_error(e, &limits))?;
    Ok(Response::Path {
        edges_examined: outcome.edges_examined,
        path: outcome.path,
    })
}

fn writer(session: Option<&WriteSession>) -> Result<&WriteSession, ServerError> {
    session.ok_or_else(|| {
        ServerError::new(
            ErrorCode::ShuttingDown,
            "cubed is shutting down; the write was not stored",
        )
    })
}

/// A walk's bounds: what it asked for (0: the server's maximum), refused
/// when above the server's maximum rather than silently cut.
fn requested_limits(
    args: &Args,
    max_depth: u32,
    max_nodes: u32,
) -> Result<WalkLimits, ServerError> {
    let mut limits = args.walk_limits();
    let over = |what: &str, asked: u32, limit: u32, flag: &str| {
        ServerError::new(
            ErrorCode::LimitExceeded,
            format!(
                "walk {what} {asked} is over this server's limit of {limit} (cubed {flag}); \
                 ask for at most {limit}, or 0 for the limit itself"
            ),
        )
    };
    if max_depth > limits.max_depth {
        return Err(over(
            "depth",
            max_depth,
            limits.max_depth,
            "--max-walk-depth",
        ));
    }
    if max_nodes > limits.max_nodes {
        return Err(over(
            "node count",
            max_nodes,
            limits.max_nodes,
            "--max-walk-nodes",
        ));
    }
    if max_depth > 0 {
        limits.max_depth = max_depth;
    }
    if max_nodes > 0 {
        limits.max_nodes = max_nodes;
    }
    Ok(limits)
}

fn path_error(error: PathError, limits: &WalkLimits) -> ServerError {
    let message = match error {
        PathError::WorkLimit { edges_examined } => format!(
            "path search examined {edges_examined} edges (this server's limit, cubed \
             --max-walk-work) without settling the cheapest path; bound it with --max-cost \
             or --label"
        ),
        PathError::TooLong { coords } => format!(
            "the cheapest path has more than {} coordinates ({coords} reached; cubed \
             --max-walk-nodes)",
            limits.max_nodes
        ),
    };
    ServerError::new(ErrorCode::LimitExceeded, message)
}

/// What a link transaction decided.
enum LinkOutcome {
    Linked { created: bool },
    Refused(ServerError),
}

/// Why a new edge would pass `--max-edges-per-cell` at one of its ends, or
/// `None` if it fits (also used by `batch`).
pub(crate) fn edge_cap_reached(
    view: &cube_store::TxnView<'_>,
    ns: &NamespaceName,
    edge: &EdgeKey,
    max_edges: usize,
) -> Option<String> {
    let (out, _) = view.edge_degree(ns, edge.from);
    let (_, inc) = view.edge_degree(ns, edge.to);
    let (verb, coord) = if out >= max_edges {
        ("leave", edge.from)
    } else if inc >= max_edges {
        ("arrive at", edge.to)
    } else {
        return None;
    };
    Some(format!(
        "{max_edges} edges already {verb} {coord}, this server's limit (cubed --max-edges-per-cell)"
    ))
}

fn link(
    session: Option<&WriteSession>,
    args: &Args,
    ns: NamespaceName,
    edge: EdgeKey,
    weight: f64,
) -> Result<Response, ServerError> {
    let weight =
        EdgeWeight::new(weight).map_err(|why| ServerError::new(ErrorCode::BadWeight, why))?;
    let max_edges = args.max_edges_per_cell as usize;
    let (outcome, lsn) = writer(session)?
        .transact(move |view| {
            if !view.has_namespace(&ns) {
                return LinkOutcome::Refused(no_such_namespace(&ns));
            }
            let exists = view.has_edge(&ns, &edge);
            if !exists && let Some(full) = edge_cap_reached(view, &ns, &edge, max_edges) {
                return LinkOutcome::Refused(ServerError::new(
                    ErrorCode::LimitExceeded,
                    format!("{full}; unlink some first"),
                ));
            }
            view.emit(Mutation::Link { ns, edge, weight });
            LinkOutcome::Linked { created: !exists }
        })
        .map_err(|e| write_error(&e))?;
    match outcome {
        LinkOutcome::Linked { created } => Ok(Response::Link { lsn, created }),
        LinkOutcome::Refused(error) => Err(error),
    }
}

fn detach(
    session: Option<&WriteSession>,
    ns: NamespaceName,
    coord: Coord,
) -> Result<Response, ServerError> {
    let (outcome, lsn) = writer(session)?
        .transact(move |view| {
            if !view.has_namespace(&ns) {
                return Err(no_such_namespace(&ns));
            }
            let existed = view.get(&ns, coord).is_some();
            let edges = view.incident_edges(&ns, coord);
            let removed = edges.len();
            view.emit(Mutation::Detach { ns, coord, edges });
            Ok((existed, removed))
        })
        .map_err(|e| write_error(&e))?;
    let (existed, removed) = outcome?;
    Ok(Response::Detach {
        lsn,
        existed,
        // At most 2 x --max-edges-per-cell.
        edges_removed: u32::try_from(removed).unwrap_or(u32::MAX),
    })
}
