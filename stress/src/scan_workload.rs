//! The `scan` workload's pieces: random boxes over the populated part of
//! the key space, and the check of what a scan returned.
//!
//! Boxes come in three sizes (a small cube, a medium cube, a large flat
//! slab), clipped to the region the key space fills, so every box holds
//! data. A scan answer is checked completely: every cell inside the box,
//! each value decoding to the key stored at that cell (so a torn or
//! misplaced value is caught), no cell twice, and exactly as many cells as
//! the box holds keys (every key is written before the clock starts and
//! never deleted, so a missing cell is lost data).

use cube_protocol::{CellBox, Coord};

use crate::keyspace::{KeySpace, coord_of, decode_value};
use crate::rng::Rng;

/// The key space's grid: key `k` is at `(k % SIDE, k / SIDE % SIDE, k / SIDE^2)`.
const SIDE: u64 = 1024;

/// Box sizes (x, y, z), chosen uniformly; each is clipped to the filled
/// region. About 64, 4 096 and 16 384 cells when the region allows.
const SHAPES: [[u64; 3]; 3] = [[4, 4, 4], [16, 16, 16], [256, 64, 1]];

/// How far the key space reaches on each axis (cells `0..extent`).
fn extents(keys: &KeySpace) -> [u64; 3] {
    let n = keys.keys().max(1);
    [
        n.min(SIDE),
        n.div_ceil(SIDE).min(SIDE),
        n.div_ceil(SIDE * SIDE).max(1),
    ]
}

/// A random box of one of [`SHAPES`], inside the populated region.
pub fn random_box(rng: &mut Rng, keys: &KeySpace) -> CellBox {
    let extent = extents(keys);
    let shape = SHAPES[rng.below(SHAPES.len() as u64) as usize];
    let mut lo = [0i32; 3];
    let mut hi = [0i32; 3];
    for axis in 0..3 {
        let size = shape[axis].min(extent[axis]).max(1);
        let start = rng.below(extent[axis] - size + 1);
        lo[axis] = start as i32;
        hi[axis] = (start + size - 1) as i32;
    }
    CellBox::new(
        Coord::new(lo[0], lo[1], lo[2]),
        Coord::new(hi[0], hi[1], hi[2]),
    )
    .expect("lo <= hi on every axis by construction")
}

/// How many keys of the key space lie inside `region`.
pub fn keys_inside(keys: &KeySpace, region: &CellBox) -> u64 {
    let (lo, hi) = (region.lo(), region.hi());
    if lo.x >= SIDE as i32 || lo.y >= SIDE as i32 || hi.x < 0 || hi.y < 0 || hi.z < 0 {
        return 0;
    }
    let (x0, x1) = (lo.x.max(0) as u64, (hi.x as u64).min(SIDE - 1));
    let (y0, y1) = (lo.y.max(0) as u64, (hi.y as u64).min(SIDE - 1));
    let (z0, z1) = (lo.z.max(0) as u64, hi.z as u64);
    let mut count = 0;
    for z in z0..=z1 {
        for y in y0..=y1 {
            let row = z * SIDE * SIDE + y * SIDE;
            // Keys row + x for x in x0..=x1 that are below the key count.
            let end = keys.keys().saturating_sub(row).min(x1 + 1);
            count += end.saturating_sub(x0);
        }
    }
    count
}

/// Checks a whole scan answer; the error says what is wrong.
pub fn check_cells(
    keys: &KeySpace,
    region: &CellBox,
    cells: &[(Coord, Vec<u8>)],
    value_size: usize,
) -> Result<(), String> {
    let mut seen = std::collections::HashSet::with_capacity(cells.len());
    for (coord, value) in cells {
        if !region.contains(*coord) {
            return Err(format!(
                "scan of {region} returned {coord}, outside the box"
            ));
        }
        if !seen.insert(*coord) {
            return Err(format!("scan of {region} returned {coord} twice"));
        }
        let stored = decode_value(value, value_size)
            .map_err(|e| format!("scan of {region}: the value at {coord}: {e}"))?;
        if coord_of(stored.key) != *coord {
            return Err(format!(
                "scan of {region}: the value at {coord} belongs to key {} at {}",
                stored.key,
                coord_of(stored.key)
            ));
        }
    }
    let expected = keys_inside(keys, region);
    if cells.len() as u64 != expected {
        return Err(format!(
            "scan of {region} returned {} cells; the box holds {expected} written keys",
            cells.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::encode_value;

    #[test]
    fn boxes_stay_inside_the_data_and_counts_match_brute_force() {
        for n in [1u64, 100, 5000, 2_000_000] {
            let keys = KeySpace::new(n, 1).unwrap();
            let mut rng = Rng::new(n);
            for _ in 0..50 {
                let region = random_box(&mut rng, &keys);
                let inside = keys_inside(&keys, &region);
                assert!(inside > 0, "{region} holds no data for {n} keys");
                if n <= 100_000 {
                    let brute = (0..n.min(3 * SIDE * SIDE))
                        .filter(|k| region.contains(coord_of(*k)))
                        .count() as u64;
                    assert_eq!(inside, brute, "{region}");
                }
            }
        }
    }

    #[test]
    fn the_check_catches_missing_misplaced_and_duplicated_cells() {
        let keys = KeySpace::new(100, 1).unwrap();
        let region = CellBox::new(Coord::new(0, 0, 0), Coord::new(3, 0, 0)).unwrap();
        let cell = |key: u64| {
            let mut value = Vec::new();
            encode_value(key, 1, 32, &mut value);
            (coord_of(key), value)
        };
        let good: Vec<_> = (0..4).map(cell).collect();
        assert_eq!(check_cells(&keys, &region, &good, 32), Ok(()));
        let err = check_cells(&keys, &region, &good[..3], 32).unwrap_err();
        assert!(err.contains("holds 4"), "{err}");
        let mut twice = good.clone();
        twice[3] = good[2].clone();
        assert!(
            check_cells(&keys, &region, &twice, 32)
                .unwrap_err()
                .contains("twice")
        );
        let mut moved = good.clone();
        moved[1].1 = cell(2).1;
        assert!(
            check_cells(&keys, &region, &moved, 32)
                .unwrap_err()
                .contains("belongs to key 2")
        );
    }
}
