//! Which keys exist, which client owns which, where a key lives, and what
//! value a write stores.
//!
//! Keys are numbered `0..keys`. Client `c` of `n` owns the keys `k` with
//! `k % n == c`, so no two clients ever write the same key and the state
//! every acknowledged write should leave behind is known exactly. Reads go
//! anywhere.
//!
//! A value is self-describing: the key and a version (both little-endian
//! `u64`) followed by filler derived from them, so a read can tell a
//! correct value from one that belongs to another key, another version, or
//! is corrupt, without asking anyone.

use cube_protocol::Coord;

use crate::rng::{Rng, mix};

/// The smallest value that can hold the key and version header.
pub const MIN_VALUE_BYTES: usize = 16;

/// One cell's worth of side: keys fill x first, then y, then z.
const SIDE: u64 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpace {
    keys: u64,
    clients: u64,
}

impl KeySpace {
    /// `keys` must be at least `clients` so every client owns a key.
    pub fn new(keys: u64, clients: usize) -> Result<KeySpace, String> {
        let clients = clients as u64;
        if clients == 0 {
            return Err("--clients must be at least 1".to_owned());
        }
        if keys < clients {
            return Err(format!(
                "--keys {keys} is fewer than --clients {clients}: every client needs keys of its own"
            ));
        }
        // z = key / SIDE² must fit in i32.
        if keys > (1 << 40) {
            return Err(format!("--keys {keys} is over the limit of 2^40"));
        }
        Ok(KeySpace { keys, clients })
    }

    pub fn keys(&self) -> u64 {
        self.keys
    }

    pub fn clients(&self) -> usize {
        self.clients as usize
    }

    pub fn owner(&self, key: u64) -> usize {
        (key % self.clients) as usize
    }

    /// How many keys client `client` owns.
    pub fn owned_count(&self, client: usize) -> u64 {
        let client = client as u64;
        (self.keys - client).div_ceil(self.clients)
    }

    /// The key at position `index` of `client`'s own keys, and back.
    pub fn owned_key(&self, client: usize, index: u64) -> u64 {
        client as u64 + index * self.clients
    }

    pub fn owned_index(&self, key: u64) -> usize {
        (key / self.clients) as usize
    }

    pub fn random_key(&self, rng: &mut Rng) -> u64 {
        rng.below(self.keys)
    }

    pub fn random_owned_key(&self, client: usize, rng: &mut Rng) -> u64 {
        self.owned_key(client, rng.below(self.owned_count(client)))
    }
}

/// Where key `key` is stored.
pub fn coord_of(key: u64) -> Coord {
    Coord::new(
        (key % SIDE) as i32,
        ((key / SIDE) % SIDE) as i32,
        (key / (SIDE * SIDE)) as i32,
    )
}

/// The key stored at `coord`, `None` for a coordinate no key maps to.
pub fn key_of(coord: Coord) -> Option<u64> {
    let axis = |v: i32| u64::try_from(v).ok();
    let (x, y, z) = (axis(coord.x)?, axis(coord.y)?, axis(coord.z)?);
    (x < SIDE && y < SIDE).then_some(x + SIDE * (y + SIDE * z))
}

/// Fills `out` with the value version `version` of key `key` stores.
pub fn encode_value(key: u64, version: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    let seed = mix(key ^ mix(version));
    out.extend((out.len()..size).map(|i| filler_byte(seed, i)));
}

/// What a read found, once decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredValue {
    pub key: u64,
    pub version: u64,
}

/// Decodes and checks a value read back; the error says what is wrong.
pub fn decode_value(bytes: &[u8], size: usize) -> Result<StoredValue, String> {
    if bytes.len() != size {
        return Err(format!("value is {} bytes, expected {size}", bytes.len()));
    }
    let (Some(key), Some(version)) = (read_u64(bytes, 0), read_u64(bytes, 8)) else {
        return Err(format!(
            "value is {} bytes, too short for its header",
            bytes.len()
        ));
    };
    let seed = mix(key ^ mix(version));
    if let Some(at) = (MIN_VALUE_BYTES..size).find(|&i| bytes[i] != filler_byte(seed, i)) {
        return Err(format!(
            "value of key {key} version {version} is corrupt at byte {at}"
        ));
    }
    Ok(StoredValue { key, version })
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let raw: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(raw))
}

fn filler_byte(seed: u64, index: usize) -> u8 {
    (seed >> ((index % 8) * 8)) as u8 ^ (index as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_partitions_the_keys() {
        let space = KeySpace::new(10, 3).unwrap();
        let mut owned: Vec<u64> = Vec::new();
        for client in 0..3 {
            for index in 0..space.owned_count(client) {
                let key = space.owned_key(client, index);
                assert_eq!(space.owner(key), client);
                assert_eq!(space.owned_index(key), index as usize);
                owned.push(key);
            }
        }
        owned.sort_unstable();
        assert_eq!(owned, (0..10).collect::<Vec<_>>());
        assert!(KeySpace::new(2, 3).is_err());
        assert!(KeySpace::new(2, 0).is_err());
    }

    #[test]
    fn coords_are_distinct() {
        let a = coord_of(5);
        let b = coord_of(5 + 1024);
        let c = coord_of(5 + 1024 * 1024);
        assert_eq!(a, Coord::new(5, 0, 0));
        assert_eq!(b, Coord::new(5, 1, 0));
        assert_eq!(c, Coord::new(5, 0, 1));
        for key in [0, 5, 1023, 1024, 5 + 1024 * 1024, (1 << 40) - 1] {
            assert_eq!(key_of(coord_of(key)), Some(key));
        }
        assert_eq!(key_of(Coord::new(1024, 0, 0)), None);
        assert_eq!(key_of(Coord::new(0, -1, 0)), None);
    }

    #[test]
    fn values_round_trip_and_catch_damage() {
        let mut value = Vec::new();
        encode_value(42, 7, 64, &mut value);
        assert_eq!(value.len(), 64);
        assert_eq!(
            decode_value(&value, 64).unwrap(),
            StoredValue {
                key: 42,
                version: 7
            }
        );
        let mut other = Vec::new();
        encode_value(42, 8, 64, &mut other);
        assert_ne!(value, other);
        value[40] ^= 1;
        assert!(decode_value(&value, 64).unwrap_err().contains("byte 40"));
        assert!(decode_value(&value[..10], 64).is_err());
        encode_value(1, 1, 16, &mut value);
        assert_eq!(decode_value(&value, 16).unwrap().key, 1);
    }
}
