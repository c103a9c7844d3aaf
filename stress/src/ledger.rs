//! What each client has written: the expected state of its keys.
//!
//! Every write stores a new version of one of the client's own keys
//! (versions only grow). A write the target acknowledged must be visible
//! from then on. A write whose connection died before the answer came (the
//! daemon was SIGKILLed mid-request) may or may not have landed: until the
//! next acknowledged write to that key, or the next check, either version
//! is correct.

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
    states: Vec<KeyState>,
    next_version: u64,
    acked_writes: u64,
}

impl Ledger {
    pub fn new(client: usize, keys: KeySpace) -> Ledger {
        Ledger {
            client,
            keys,
            states: vec![KeyState::default(); keys.owned_count(client) as usize],
            next_version: 1,
            acked_writes: 0,
        }
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
        self.states
            .get(self.keys.owned_index(key))
            .copied()
            .unwrap_or_default()
    }

    /// This client's keys with their expected states.
    pub fn iter(&self) -> impl Iterator<Item = (u64, KeyState)> + '_ {
        self.states
            .iter()
            .enumerate()
            .map(|(index, state)| (self.keys.owned_key(self.client, index as u64), *state))
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
}
