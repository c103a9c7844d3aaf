//! [`Client`] methods for edges between coordinates: `link`, `unlink`,
//! `edges`, `walk`, `path` and `detach`. Labels and weights are checked
//! here before anything is sent, so a bad one is a
//! [`ClientError::BadArgument`] naming the problem.

use cube_protocol::{
    Coord, Direction, EdgeInfo, EdgeLabel, EdgeWeight, NamespaceName, PathFound, Request, Response,
    WalkResult,
};

use crate::client::Client;
use crate::error::ClientError;

/// What a walk asks for besides its start; the default follows outgoing
/// edges of any label to the server's depth and node limits, without values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalkOptions {
    pub direction: Direction,
    /// Follow only edges with this label.
    pub label: Option<String>,
    /// Most hops; 0 means the server's maximum (`cubed --max-walk-depth`).
    pub max_depth: u32,
    /// Most coordinates returned; 0 means the server's maximum.
    pub max_nodes: u32,
    /// Also return each reached cell's value.
    pub with_values: bool,
}

/// What a link did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linked {
    /// The write's log sequence number.
    pub lsn: u64,
    /// `false` when the edge existed and only its weight was set.
    pub created: bool,
}

/// What a detach removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detached {
    /// The write's log sequence number.
    pub lsn: u64,
    /// Whether the cell had a value.
    pub existed: bool,
    /// How many edges into or out of the cell were removed.
    pub edges_removed: u32,
}

/// A path answer with the work it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct PathAnswer {
    /// `None`: no path within the cost bound.
    pub path: Option<PathFound>,
    /// Edges the server examined to find it.
    pub edges_examined: u64,
}

fn namespace(name: &str) -> Result<NamespaceName, ClientError> {
    NamespaceName::new(name).map_err(|e| ClientError::BadArgument(e.to_string()))
}

fn label(text: &str) -> Result<EdgeLabel, ClientError> {
    EdgeLabel::new(text).map_err(ClientError::BadArgument)
}

fn label_filter(text: Option<&str>) -> Result<Option<EdgeLabel>, ClientError> {
    text.map(label).transpose()
}

fn unexpected(what: &str, response: &Response) -> ClientError {
    ClientError::UnexpectedResponse(format!(
        "{} answer to a {what} request",
        response.opcode().name()
    ))
}

impl Client {
    /// Creates the edge `from -> to` with `label` (`""` is the default
    /// label) and `weight` (finite, at least 0; 1.0 is the usual default),
    /// or sets the weight of the one that exists.
    pub fn link(
        &mut self,
        ns: &str,
        from: Coord,
        to: Coord,
        edge_label: &str,
        weight: f64,
    ) -> Result<Linked, ClientError> {
        let weight = EdgeWeight::new(weight).map_err(ClientError::BadArgument)?;
        let request = Request::Link {
            ns: namespace(ns)?,
            from,
            to,
            label: label(edge_label)?,
            weight: weight.get(),
        };
        match self.call(&request)? {
            Response::Link { lsn, created } => Ok(Linked { lsn, created }),
            other => Err(unexpected("link", &other)),
        }
    }

    /// Removes the edge `from -> to` with `label`; returns whether it existed.
    pub fn unlink(
        &mut self,
        ns: &str,
        from: Coord,
        to: Coord,
        edge_label: &str,
    ) -> Result<bool, ClientError> {
        let request = Request::Unlink {
            ns: namespace(ns)?,
            from,
            to,
            label: label(edge_label)?,
        };
        match self.call(&request)? {
            Response::Unlink { existed, .. } => Ok(existed),
            other => Err(unexpected("unlink", &other)),
        }
    }

    /// The edges of `coord` in `direction` (outgoing first), only those
    /// labelled `label` if given. A coordinate without edges has none.
    pub fn edges(
        &mut self,
        ns: &str,
        coord: Coord,
        direction: Direction,
        edge_label: Option<&str>,
    ) -> Result<Vec<EdgeInfo>, ClientError> {
        let request = Request::Edges {
            ns: namespace(ns)?,
            coord,
            direction,
            label: label_filter(edge_label)?,
        };
        match self.call(&request)? {
            Response::Edges(edges) => Ok(edges),
            other => Err(unexpected("edges", &other)),
        }
    }

    /// Breadth-first from `from`: each coordinate reached, once, with its
    /// hop distance, nearest first. The start itself is not listed, so a
    /// coordinate without edges gives an empty walk. Check
    /// [`WalkResult::stop`]: a walk can stop early at a limit.
    pub fn walk(
        &mut self,
        ns: &str,
        from: Coord,
        options: &WalkOptions,
    ) -> Result<WalkResult, ClientError> {
        let request = Request::Walk {
            ns: namespace(ns)?,
            from,
            direction: options.direction,
            label: label_filter(options.label.as_deref())?,
            max_depth: options.max_depth,
            max_nodes: options.max_nodes,
            with_values: options.with_values,
        };
        match self.call(&request)? {
            Response::Walk(walk) => Ok(walk),
            other => Err(unexpected("walk", &other)),
        }
    }

    /// The cheapest path `from -> ... -> to` along outgoing edges (only
    /// `label`'s if given) costing at most `max_cost` (`f64::INFINITY`: no
    /// bound).
    pub fn path(
        &mut self,
        ns: &str,
        from: Coord,
        to: Coord,
        edge_label: Option<&str>,
        max_cost: f64,
    ) -> Result<PathAnswer, ClientError> {
        if max_cost.is_nan() || max_cost < 0.0 {
            return Err(ClientError::BadArgument(format!(
                "max cost {max_cost} must be a number >= 0 (or infinity for no bound)"
            )));
        }
        let request = Request::Path {
            ns: namespace(ns)?,
            from,
            to,
            label: label_filter(edge_label)?,
            max_cost,
        };
        match self.call(&request)? {
            Response::Path {
                edges_examined,
                path,
            } => Ok(PathAnswer {
                path,
                edges_examined,
            }),
            other => Err(unexpected("path", &other)),
        }
    }

    /// Deletes the value at `coord` and every edge into or out of it, in
    /// one atomic write.
    pub fn detach(&mut self, ns: &str, coord: Coord) -> Result<Detached, ClientError> {
        let request = Request::Detach {
            ns: namespace(ns)?,
            coord,
        };
        match self.call(&request)? {
            Response::Detach {
                lsn,
                existed,
                edges_removed,
            } => Ok(Detached {
                lsn,
                existed,
                edges_removed,
            }),
            other => Err(unexpected("detach", &other)),
        }
    }
}
