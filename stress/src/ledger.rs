//! What each client has written: the expected state of its keys.
//!
//! Every write stores a new version of one of the client's own keys
//! (versions only grow). A write the target acknowledged must be visible
//! from then on. A write whose connection died before the answer came (the
//! daemon was SIGKILLed mid-request) may or may not have landed: until the
//! next acknowledged write to that key, or the next check, either version
//! is correct.
//!
//! A ledger starts from a baseline: every key absent (a fresh key space),
//! or every key at one version (a data set written before the run, as
//! `cube-stress scale` serves 200 M keys). The per-key states are allocated
//! on the first write, so a read-only run over a huge key space costs no
//! memory per key.

use crate::keyspace::{KeySpace, StoredValue};

/// Version 0 means "never written": the key must be absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyState {
    pub acked: u64,
    /// A later version whose outcome is unknown, or 0.
    pub uncertain: u64,
}

impl KeyState {
    pub fn written(&self) -> bool {
        self.acked != 0 || self.uncertain != 0
    }

    /// Whether `found` (None = absent) is a state this key may be in.
    pub fn accepts(&self, found: Option<u64>) -> bool {
        let version = found.unwrap_or(0);
        version == self.acked || (self.uncertain != 0 && version == self.uncertain)
    }
}

#[derive(Clone, Debug)]
pub struct Ledger {
    client: usize,
    keys: KeySpace,
    /// The state of every key this run has not written.
    baseline: KeyState,
    /// One state per owned key, allocated (filled with `baseline`) by the
    /// first write; empty until then.
    states: Vec<KeyState>,
    next_version: u64,
    acked_writes: u64,
}

impl Ledger {
    /// Every key starts absent.
    pub fn new(client: usize, keys: KeySpace) -> Ledger {
        Ledger::with_baseline(client, keys, 0)
    }

    /// Every key starts at `version` (0: absent), written before the run;
    /// this client's writes store later versions.
    pub fn with_baseline(client: usize, keys: KeySpace, version: u64) -> Ledger {
        Ledger {
            client,
            keys,
            baseline: KeyState {
                acked: version,
                uncertain: 0,
            },
            states: Vec::new(),
            next_version: version + 1,
            acked_writes: 0,
        }
    }

    /// Whether the per-key states are allocated (some key was written).
    pub fn allocated(&self) -> bool {
        !self.states.is_empty()
    }

    pub fn client(&self) -> usize {
        self.client
    }

    /// The version the next write of this client stores.
    pub fn next_version(&mut self) -> u64 {
        let version = self.next_version;
        self.next_version += 1;
        version
    }

    pub fn acked(&mut self, key: u64, version: u64) {
        self.acked_writes += 1;
        if let Some(state) = self.state_mut(key) {
            *state = KeyState {
                acked: version,
                uncertain: 0,
            };
        }
    }

    /// The write of `version` to `key` got no answer.
    pub fn unknown(&mut self, key: u64, version: u64) {
        if let Some(state) = self.state_mut(key) {
            state.uncertain = version;
        }
    }

    /// A check read `found`: whatever it was (if acceptable) is now the
    /// known state, which settles an uncertain write.
    pub fn settle(&mut self, key: u64, found: Option<u64>) {
        if let Some(state) = self.state_mut(key) {
            *state = KeyState {
                acked: found.unwrap_or(0),
                uncertain: 0,
            };
        }
    }

    pub fn state(&self, key: u64) -> KeyState {
        let index = self.keys.owned_index(key);
        if index as u64 >= self.keys.owned_count(self.client) {
            return KeyState::default();
        }
        self.states.get(index).copied().unwrap_or(self.baseline)
    }

    /// This client's keys with their expected states.
    pub fn iter(&self) -> impl Iterator<Item = (u64, KeyState)> + '_ {
        (0..self.keys.owned_count(self.client)).map(|index| {
            let state = self
                .states
                .get(index as usize)
                .copied()
                .unwrap_or(self.baseline);
            (self.keys.owned_key(self.client, index), state)
        })
    }

    pub fn acked_writes(&self) -> u64 {
        self.acked_writes
    }

    /// Writes whose outcome is still unknown.
    pub fn uncertain_count(&self) -> usize {
        self.states.iter().filter(|s| s.uncertain != 0).count()
    }

    /// Checks a read of one of this client's keys: `Ok` or what is wrong.
    pub fn check_read(&self, key: u64, found: Option<StoredValue>) -> Result<(), String> {
        let state = self.state(key);
        if let Some(value) = found
            && value.key != key
        {
            return Err(format!(
                "key {key}: found the value of key {} (version {})",
                value.key, value.version
            ));
        }
        let version = found.map(|v| v.version);
        if state.accepts(version) {
            Ok(())
        } else {
            Err(describe_mismatch(key, state, version))
        }
    }

    fn state_mut(&mut self, key: u64) -> Option<&mut KeyState> {
        let index = self.keys.owned_index(key);
        let owned = self.keys.owned_count(self.client) as usize;
        if index >= owned {
            return None;
        }
        if self.states.is_empty() {
            self.states = vec![self.baseline; owned];
        }
        self.states.get_mut(index)
    }
}

fn describe_mismatch(key: u64, state: KeyState, found: Option<u64>) -> String {
    let coord = crate::keyspace::coord_of(key);
    let expected = match (state.acked, state.uncertain) {
        (0, 0) => "absent".to_owned(),
        (0, u) => format!("absent or version {u} (write in flight at a crash)"),
        (a, 0) => format!("version {a}"),
        (a, u) => format!("version {a} or {u} (write in flight at a crash)"),
    };
    let found = found.map_or_else(|| "absent".to_owned(), |v| format!("version {v}"));
    format!("key {key} at {coord}: expected {expected}, found {found}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(key: u64, version: u64) -> Option<StoredValue> {
        Some(StoredValue { key, version })
    }

    #[test]
    fn acked_writes_must_be_visible() {
        let keys = KeySpace::new(10, 2).unwrap();
        let mut ledger = Ledger::new(1, keys);
        assert!(ledger.check_read(3, None).is_ok());
        let v = ledger.next_version();
        ledger.acked(3, v);
        assert!(ledger.check_read(3, value(3, v)).is_ok());
        let lost = ledger.check_read(3, None).unwrap_err();
        assert!(lost.contains("expected version 1, found absent"), "{lost}");
        assert!(ledger.check_read(3, value(5, v)).is_err());
        assert_eq!(ledger.acked_writes(), 1);
    }

    #[test]
    fn an_unanswered_write_may_or_may_not_land() {
        let keys = KeySpace::new(10, 2).unwrap();
        let mut ledger = Ledger::new(0, keys);
        let first = ledger.next_version();
        ledger.acked(4, first);
        let second = ledger.next_version();
        ledger.unknown(4, second);
        assert_eq!(ledger.uncertain_count(), 1);
        assert!(ledger.check_read(4, value(4, first)).is_ok());
        assert!(ledger.check_read(4, value(4, second)).is_ok());
        assert!(ledger.check_read(4, None).is_err());
        ledger.settle(4, Some(second));
        assert_eq!(ledger.uncertain_count(), 0);
        assert!(ledger.check_read(4, value(4, first)).is_err());
        let all: Vec<u64> = ledger.iter().map(|(k, _)| k).collect();
        assert_eq!(all, vec![0, 2, 4, 6, 8]);
    }

    #[test]
    fn a_baseline_costs_nothing_until_a_write() {
        // 2^40 keys: a state per key would be 16 TiB.
        let keys = KeySpace::new(1 << 40, 16).unwrap();
        let ledger = Ledger::with_baseline(3, keys, 1);
        assert!(!ledger.allocated());
        assert!(
            ledger
                .check_read(3 + 16 * 1000, value(3 + 16 * 1000, 1))
                .is_ok()
        );
        let absent = ledger.check_read(19, None).unwrap_err();
        assert!(
            absent.contains("expected version 1, found absent"),
            "{absent}"
        );
        assert!(ledger.check_read(19, value(19, 2)).is_err());
        assert_eq!(ledger.uncertain_count(), 0);
        assert_eq!(
            ledger
                .iter()
                .take(2)
                .map(|(k, s)| (k, s.acked))
                .collect::<Vec<_>>(),
            [(3, 1), (19, 1)]
        );
        assert!(!ledger.allocated());
    }

    #[test]
    fn the_first_write_keeps_the_baseline_of_the_other_keys() {
        let keys = KeySpace::new(10, 2).unwrap();
        let mut ledger = Ledger::with_baseline(1, keys, 1);
        let version = ledger.next_version();
        assert_eq!(version, 2, "writes come after the baseline's version");
        ledger.acked(5, version);
        assert!(ledger.allocated());
        assert!(ledger.check_read(5, value(5, 2)).is_ok());
        assert!(ledger.check_read(5, value(5, 1)).is_err());
        assert!(ledger.check_read(7, value(7, 1)).is_ok());
        let states: Vec<(u64, u64)> = ledger.iter().map(|(k, s)| (k, s.acked)).collect();
        assert_eq!(states, [(1, 1), (3, 1), (5, 2), (7, 1), (9, 1)]);
        // A fresh ledger's keys start absent, allocated or not.
        let fresh = Ledger::new(0, keys);
        assert!(fresh.check_read(4, None).is_ok());
        assert_eq!(fresh.iter().filter(|(_, s)| s.written()).count(), 0);
    }
}
