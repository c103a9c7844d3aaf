//! Edges between coordinates: the vocabulary (labels, weights, directions)
//! and the body codecs of `link`, `unlink`, `edges`, `walk`, `path` and
//! `detach` (opcodes 0x0020-0x0025, `docs/protocol.md` section 6).
//!
//! An edge is directed, `from -> to`, inside one namespace, identified by
//! `(from, to, label)`; its weight is a non-negative finite `f64`. The
//! types here make a bad label or weight unrepresentable once checked, so
//! the store never has to wonder.

use std::fmt;

use crate::error::DecodeError;
use crate::model::Coord;
use crate::wire::{BodyReader, put_coord, put_short_string, put_u32, put_u64};

/// Longest edge label, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;
/// Most edges in one `edges` response (both directions together).
pub const MAX_EDGE_LIST: u32 = 65_536;
/// Most nodes in one `walk` response, and most coordinates in one `path`
/// response. The server's own limits (`--max-walk-nodes`) are at most this.
pub const MAX_WALK_NODES: u32 = 1_000_000;

/// An edge's label: 0 to [`MAX_LABEL_BYTES`] bytes of UTF-8. The empty
/// label is the default and an ordinary label.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EdgeLabel(String);

impl EdgeLabel {
    pub fn new(text: &str) -> Result<EdgeLabel, String> {
        if text.len() > MAX_LABEL_BYTES {
            return Err(format!(
                "edge label {:?} is {} bytes; labels are at most {MAX_LABEL_BYTES} bytes",
                truncate_for_message(text),
                text.len()
            ));
        }
        Ok(EdgeLabel(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for EdgeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn truncate_for_message(text: &str) -> &str {
    let mut end = text.len().min(24);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// An edge's weight: finite and not negative, so that cheapest paths are
/// well defined (Dijkstra needs non-negative weights) and every weight
/// compares with every other. `-0.0` is stored as `0.0`.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct EdgeWeight(f64);

// No NaN can be inside, so equality is total.
impl Eq for EdgeWeight {}

impl EdgeWeight {
    /// What `link` uses when no weight is given.
    pub const DEFAULT: EdgeWeight = EdgeWeight(1.0);

    pub fn new(weight: f64) -> Result<EdgeWeight, String> {
        if weight.is_nan() {
            return Err("edge weight is NaN; give a finite number >= 0".to_owned());
        }
        if weight.is_infinite() {
            return Err(format!(
                "edge weight {weight} is infinite; give a finite number >= 0"
            ));
        }
        if weight < 0.0 {
            return Err(format!(
                "edge weight {weight} is negative; weights must be >= 0 so cheapest paths are well defined"
            ));
        }
        // Adding 0.0 turns -0.0 into 0.0.
        Ok(EdgeWeight(weight + 0.0))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl Default for EdgeWeight {
    fn default() -> EdgeWeight {
        EdgeWeight::DEFAULT
    }
}

/// Which edges of a coordinate to follow or list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Direction {
    /// Edges leaving the coordinate (`coord -> other`).
    #[default]
    Out = 0,
    /// Edges arriving at it (`other -> coord`).
    In = 1,
    /// Both.
    Both = 2,
}

impl Direction {
    pub fn from_u8(raw: u8) -> Option<Direction> {
        match raw {
            0 => Some(Direction::Out),
            1 => Some(Direction::In),
            2 => Some(Direction::Both),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Direction::Out => "out",
            Direction::In => "in",
            Direction::Both => "both",
        }
    }

    pub fn includes_out(self) -> bool {
        matches!(self, Direction::Out | Direction::Both)
    }

    pub fn includes_in(self) -> bool {
        matches!(self, Direction::In | Direction::Both)
    }
}

/// One edge of an `edges` answer, seen from the coordinate asked about.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeInfo {
    /// [`Direction::Out`]: `coord -> other`; [`Direction::In`]:
    /// `other -> coord`. Never [`Direction::Both`].
    pub direction: Direction,
    pub other: Coord,
    pub label: EdgeLabel,
    pub weight: f64,
}

/// One coordinate a walk reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkNode {
    pub coord: Coord,
    /// Hops from the start (at least 1: the start itself is not listed).
    pub distance: u32,
    /// The cell's value, when the walk asked for values and there is one.
    pub value: Option<Vec<u8>>,
}

/// A walk's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkResult {
    /// Why the list ends where it does.
    pub stop: WalkStop,
    /// Edges looked at, including those filtered out by label or leading
    /// to coordinates already reached: the work the walk cost.
    pub edges_examined: u64,
    /// Whether the walk asked for values (then each node says whether its
    /// cell has one); without it every `value` is `None`.
    pub with_values: bool,
    /// Reached coordinates in breadth-first order: by distance, and in no
    /// particular order within one distance.
    pub nodes: Vec<WalkNode>,
}

/// Why a walk's answer ends where it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WalkStop {
    /// Every coordinate within the depth was reached.
    Complete = 0,
    /// The node limit (the request's or the server's) was reached.
    MaxNodes = 1,
    /// The server's work limit (edges examined per walk) was reached.
    MaxWork = 2,
    /// The next node's value would not fit in one frame.
    FrameFull = 3,
}

impl WalkStop {
    pub fn from_u8(raw: u8) -> Option<WalkStop> {
        match raw {
            0 => Some(WalkStop::Complete),
            1 => Some(WalkStop::MaxNodes),
            2 => Some(WalkStop::MaxWork),
            3 => Some(WalkStop::FrameFull),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WalkStop::Complete => "complete",
            WalkStop::MaxNodes => "max_nodes",
            WalkStop::MaxWork => "max_work",
            WalkStop::FrameFull => "frame_full",
        }
    }
}

/// A cheapest path: the coordinates from start to end, both included.
#[derive(Clone, Debug, PartialEq)]
pub struct PathFound {
    pub coords: Vec<Coord>,
    pub cost: f64,
}

// ---------------------------------------------------------------------------
// Field codecs shared by the messages above (used by `request.rs` and `response.rs`).
// ---------------------------------------------------------------------------

/// Walk request flags: bit 0 asks for each reached cell's value.
pub(crate) const WALK_FLAG_VALUES: u8 = 1;

pub(crate) fn put_label(b: &mut Vec<u8>, label: &EdgeLabel) {
    put_short_string(b, label.as_str(), MAX_LABEL_BYTES);
}

pub(crate) fn read_label(r: &mut BodyReader<'_>) -> Result<EdgeLabel, DecodeError> {
    let text = r.short_string("edge label", MAX_LABEL_BYTES)?;
    // The length was checked by `short_string`.
    Ok(EdgeLabel(text))
}

/// A `bool`, then a label only if it is 1: `None` means every label.
pub(crate) fn put_label_filter(b: &mut Vec<u8>, label: &Option<EdgeLabel>) {
    match label {
        None => b.push(0),
        Some(label) => {
            b.push(1);
            put_label(b, label);
        }
    }
}

pub(crate) fn read_label_filter(r: &mut BodyReader<'_>) -> Result<Option<EdgeLabel>, DecodeError> {
    Ok(if r.bool()? {
        Some(read_label(r)?)
    } else {
        None
    })
}

pub(crate) fn put_f64(b: &mut Vec<u8>, v: f64) {
    put_u64(b, v.to_bits());
}

pub(crate) fn read_f64(r: &mut BodyReader<'_>) -> Result<f64, DecodeError> {
    Ok(f64::from_bits(r.u64()?))
}

pub(crate) fn read_direction(r: &mut BodyReader<'_>) -> Result<Direction, DecodeError> {
    let raw = r.u8()?;
    Direction::from_u8(raw).ok_or(DecodeError::BadField {
        what: "edge direction",
        got: u64::from(raw),
    })
}

/// `count: u32`, checked against `limit` and against what the body can
/// hold at `min_bytes` each, so a forged count allocates nothing.
pub(crate) fn read_count(
    r: &mut BodyReader<'_>,
    what: &'static str,
    limit: u32,
    min_bytes: usize,
) -> Result<usize, DecodeError> {
    let count = r.u32()?;
    if count > limit {
        return Err(DecodeError::TooMany {
            what,
            got: u64::from(count),
            limit: u64::from(limit),
        });
    }
    let count = count as usize;
    if count.saturating_mul(min_bytes) > r.remaining() {
        return Err(DecodeError::Truncated {
            offset: 0,
            needed: count * min_bytes - r.remaining(),
        });
    }
    Ok(count)
}

/// The `edges` answer: `count: u32`, then per edge `direction: u8`,
/// `other: coord`, `label: str16`, `weight: f64`.
pub(crate) fn put_edge_list(b: &mut Vec<u8>, edges: &[EdgeInfo]) {
    let edges = &edges[..edges.len().min(MAX_EDGE_LIST as usize)];
    put_u32(b, edges.len() as u32);
    for edge in edges {
        b.push(edge.direction as u8);
        put_coord(b, edge.other);
        put_label(b, &edge.label);
        put_f64(b, edge.weight);
    }
}

/// The smallest encoded edge: direction, coord, empty label, weight.
const MIN_EDGE_BYTES: usize = 1 + 12 + 2 + 8;

pub(crate) fn read_edge_list(r: &mut BodyReader<'_>) -> Result<Vec<EdgeInfo>, DecodeError> {
    let count = read_count(r, "edge count", MAX_EDGE_LIST, MIN_EDGE_BYTES)?;
    let mut edges = Vec::with_capacity(count);
    for _ in 0..count {
        let direction = read_direction(r)?;
        if direction == Direction::Both {
            return Err(DecodeError::BadField {
                what: "edge direction in an edge list",
                got: Direction::Both as u64,
            });
        }
        edges.push(EdgeInfo {
            direction,
            other: r.coord()?,
            label: read_label(r)?,
            weight: read_f64(r)?,
        });
    }
    Ok(edges)
}

/// The `walk` answer: `stop: u8`, `edges_examined: u64`, `with_values:
/// bool`, `count: u32`, then per node `coord`, `distance: u32` and, only
/// when `with_values` = 1, `found: bool` and (if found) `value: blob`.
pub(crate) fn put_walk(b: &mut Vec<u8>, walk: &WalkResult) {
    let nodes = &walk.nodes[..walk.nodes.len().min(MAX_WALK_NODES as usize)];
    b.push(walk.stop as u8);
    put_u64(b, walk.edges_examined);
    b.push(u8::from(walk.with_values));
    put_u32(b, nodes.len() as u32);
    for node in nodes {
        put_coord(b, node.coord);
        put_u32(b, node.distance);
        if walk.with_values {
            match &node.value {
                None => b.push(0),
                Some(value) => {
                    b.push(1);
                    crate::wire::put_blob(b, value);
                }
            }
        }
    }
}

pub(crate) fn read_walk(
    r: &mut BodyReader<'_>,
    max_value_bytes: usize,
) -> Result<WalkResult, DecodeError> {
    let raw = r.u8()?;
    let stop = WalkStop::from_u8(raw).ok_or(DecodeError::BadField {
        what: "walk stop reason",
        got: u64::from(raw),
    })?;
    let edges_examined = r.u64()?;
    let with_values = r.bool()?;
    let min_bytes = 12 + 4 + usize::from(with_values);
    let count = read_count(r, "walk node count", MAX_WALK_NODES, min_bytes)?;
    let mut nodes = Vec::with_capacity(count);
    for _ in 0..count {
        let coord = r.coord()?;
        let distance = r.u32()?;
        let value = if with_values && r.bool()? {
            Some(r.blob("value", max_value_bytes)?)
        } else {
            None
        };
        nodes.push(WalkNode {
            coord,
            distance,
            value,
        });
    }
    Ok(WalkResult {
        stop,
        edges_examined,
        with_values,
        nodes,
    })
}

/// The `path` answer: `edges_examined: u64`, `found: bool`, then only if
/// found `cost: f64`, `count: u32` and `count` coordinates.
pub(crate) fn put_path(b: &mut Vec<u8>, edges_examined: u64, path: &Option<PathFound>) {
    put_u64(b, edges_examined);
    match path {
        None => b.push(0),
        Some(found) => {
            b.push(1);
            put_f64(b, found.cost);
            let coords = &found.coords[..found.coords.len().min(MAX_WALK_NODES as usize)];
            put_u32(b, coords.len() as u32);
            for c in coords {
                put_coord(b, *c);
            }
        }
    }
}

pub(crate) fn read_path(r: &mut BodyReader<'_>) -> Result<(u64, Option<PathFound>), DecodeError> {
    let edges_examined = r.u64()?;
    if !r.bool()? {
        return Ok((edges_examined, None));
    }
    let cost = read_f64(r)?;
    let count = read_count(r, "path length", MAX_WALK_NODES, 12)?;
    let mut coords = Vec::with_capacity(count);
    for _ in 0..count {
        coords.push(r.coord()?);
    }
    Ok((edges_examined, Some(PathFound { coords, cost })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_refuse_nan_infinity_and_negatives() {
        assert!(EdgeWeight::new(f64::NAN).unwrap_err().contains("NaN"));
        assert!(
            EdgeWeight::new(f64::INFINITY)
                .unwrap_err()
                .contains("infinite")
        );
        assert!(EdgeWeight::new(-1.0).unwrap_err().contains("negative"));
        assert!(EdgeWeight::new(-0.0).unwrap().get().is_sign_positive());
        assert_eq!(EdgeWeight::new(2.5).unwrap().get(), 2.5);
        assert_eq!(EdgeWeight::default().get(), 1.0);
    }

    #[test]
    fn labels_are_at_most_64_bytes() {
        assert!(EdgeLabel::new(&"a".repeat(64)).is_ok());
        assert!(
            EdgeLabel::new(&"a".repeat(65))
                .unwrap_err()
                .contains("at most 64")
        );
        assert!(EdgeLabel::new("").unwrap().is_empty());
    }
}
