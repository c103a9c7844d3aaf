//! The data model shared by every crate: coordinates and namespace names.

use std::fmt;

use crate::error::DecodeError;

/// A cell address: three signed 32-bit integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Coord {
    pub x: i32,
    pub y: i32,
    pub z: i32,
}

impl Coord {
    pub const fn new(x: i32, y: i32, z: i32) -> Coord {
        Coord { x, y, z }
    }
}

impl fmt::Display for Coord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{},{}", self.x, self.y, self.z)
    }
}

/// An inclusive box of cells: every cell with `lo.x <= x <= hi.x` and the
/// same for y and z. Constructed only through [`CellBox::new`], so
/// `lo <= hi` on every axis always holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CellBox {
    lo: Coord,
    hi: Coord,
}

impl CellBox {
    /// The box from corner `lo` to corner `hi`, both included. An axis with
    /// `lo` above `hi` is an error that names the axis (an empty box is far
    /// more often a mistake than a wish).
    pub fn new(lo: Coord, hi: Coord) -> Result<CellBox, String> {
        for (axis, low, high) in [("x", lo.x, hi.x), ("y", lo.y, hi.y), ("z", lo.z, hi.z)] {
            if low > high {
                return Err(format!(
                    "bad box {lo} .. {hi}: {axis}0 = {low} is above {axis}1 = {high}; \
                     give the low corner first"
                ));
            }
        }
        Ok(CellBox { lo, hi })
    }

    pub fn lo(&self) -> Coord {
        self.lo
    }

    pub fn hi(&self) -> Coord {
        self.hi
    }

    pub fn contains(&self, c: Coord) -> bool {
        (self.lo.x..=self.hi.x).contains(&c.x)
            && (self.lo.y..=self.hi.y).contains(&c.y)
            && (self.lo.z..=self.hi.z).contains(&c.z)
    }

    /// The number of cells in the box (up to 2^96, hence `u128`).
    pub fn volume(&self) -> u128 {
        let side = |lo: i32, hi: i32| (i64::from(hi) - i64::from(lo) + 1) as u128;
        side(self.lo.x, self.hi.x) * side(self.lo.y, self.hi.y) * side(self.lo.z, self.hi.z)
    }
}

impl fmt::Display for CellBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.lo, self.hi)
    }
}

/// Parses `x,y,z` (spaces around the numbers are allowed).
pub fn parse_coord(text: &str) -> Result<Coord, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() != 3 {
        return Err(format!(
            "bad coordinate {text:?}: expected three integers as X,Y,Z (for example 1,-2,3)"
        ));
    }
    let mut values = [0i32; 3];
    for (slot, (part, axis)) in values.iter_mut().zip(parts.iter().zip(["x", "y", "z"])) {
        *slot = part.parse::<i32>().map_err(|_| {
            format!(
                "bad coordinate {text:?}: {axis} = {part:?} is not an integer in {}..={}",
                i32::MIN,
                i32::MAX
            )
        })?;
    }
    Ok(Coord::new(values[0], values[1], values[2]))
}

/// A validated namespace name: 1 to 64 bytes of `[a-z0-9_-]`.
///
/// Shared, not owned: every mutation, overlay entry and undo record of a
/// transaction carries its namespace, and a clone that is one atomic
/// increment instead of an allocation and a copy is measurable on the
/// writer's hot path (a counter `run` cloned the name about 8 times).
// The derived `Hash` hashes the content, which agrees with `eq`: equal
// pointers mean equal content.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Debug, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceName(std::sync::Arc<str>);

/// Names compare by content, but nearly every comparison on the writer is
/// of two clones of one name (a map key and a mutation's field), which
/// the pointer check answers without reading the bytes.
impl PartialEq for NamespaceName {
    fn eq(&self, other: &NamespaceName) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl NamespaceName {
    pub const MAX_BYTES: usize = 64;

    /// Checks the name rules; the error says which rule was broken.
    pub fn new(name: &str) -> Result<NamespaceName, DecodeError> {
        if name.is_empty() || name.len() > Self::MAX_BYTES {
            return Err(DecodeError::BadNamespace(format!(
                "namespace name must be 1 to {} bytes long, got {}",
                Self::MAX_BYTES,
                name.len()
            )));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '-'))
        {
            return Err(DecodeError::BadNamespace(format!(
                "namespace name {name:?} has {bad:?}; only a-z, 0-9, '_' and '-' are allowed"
            )));
        }
        Ok(NamespaceName(std::sync::Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NamespaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_parse_with_signs_and_spaces() {
        assert_eq!(parse_coord("1,-2, 3").unwrap(), Coord::new(1, -2, 3));
        assert_eq!(
            parse_coord("-2147483648,2147483647,0").unwrap(),
            Coord::new(i32::MIN, i32::MAX, 0)
        );
        assert!(parse_coord("1,2").unwrap_err().contains("three integers"));
        assert!(parse_coord("1,2,x").unwrap_err().contains("z = \"x\""));
        assert!(parse_coord("1,2,2147483648").is_err());
    }

    #[test]
    fn boxes_check_their_corners() {
        let b = CellBox::new(Coord::new(-1, 0, 5), Coord::new(1, 0, 9)).unwrap();
        assert_eq!(b.volume(), 3 * 5);
        assert!(b.contains(Coord::new(0, 0, 5)) && !b.contains(Coord::new(0, 1, 5)));
        let err = CellBox::new(Coord::new(0, 2, 0), Coord::new(0, 1, 0)).unwrap_err();
        assert!(err.contains("y0 = 2 is above y1 = 1"), "{err}");
        let all = CellBox::new(
            Coord::new(i32::MIN, i32::MIN, i32::MIN),
            Coord::new(i32::MAX, i32::MAX, i32::MAX),
        )
        .unwrap();
        assert_eq!(all.volume(), 1u128 << 96);
    }

    #[test]
    fn namespace_rules() {
        assert!(NamespaceName::new("default").is_ok());
        assert!(NamespaceName::new("a-b_9").is_ok());
        assert!(NamespaceName::new("").is_err());
        assert!(NamespaceName::new("Upper").is_err());
        assert!(NamespaceName::new(&"a".repeat(65)).is_err());
        assert!(NamespaceName::new(&"a".repeat(64)).is_ok());
    }
}
