//! Namespace metadata: what a namespace is besides its data (identity,
//! curve, quotas, owner and access list, encryption), and how it is stored.
//!
//! A namespace has a **name** (what clients say) and an **id** (what the
//! state keys of checkpoint files say). The id is the LSN of the record
//! that created it, so it is unique forever in a data dir: dropping a
//! namespace and creating one with the same name gives a new id, and
//! nothing of the old one can come back under the new one (old entries in
//! checkpoint files carry the old id and are skipped, then dropped by the
//! next compaction). `default` on a fresh data dir is the one namespace
//! nobody creates: it has id 0.
//!
//! The metadata is one byte string, used both as the payload (after the
//! name) of namespace records in the WAL and as the value of the namespace's
//! state entry (`0x01 | name`) in checkpoint files:
//!
//! ```text
//! 0   8  id           u64 LE
//! 8   1  curve        1 Morton, 2 Hilbert
//! 9   1  flags        bit 0 encrypted, bit 1 max_cells, bit 2 max_bytes,
//!                     bit 3 max_edges present; other bits zero
//! 10  4  owner_uid    u32 LE
//! 14  8  max_cells    u64 LE (0 when absent)
//! 22  8  max_bytes    u64 LE (0 when absent)
//! 30  8  max_edges    u64 LE (0 when absent)
//! 38  16 key_check    encrypted only: proves the master key (crypto.rs);
//!                     zero otherwise
//! 54  2  grant_count  u16 LE, at most MAX_GRANTS
//! 56  5  each grant   uid u32 LE | read_only u8 (0 or 1)
//! ```

use std::collections::{BTreeMap, HashMap};

use byteorder::{ByteOrder, LittleEndian};
use cube_protocol::NamespaceName;

use crate::curve::Curve;
use crate::mutation::Mutation;

/// Most entries in one namespace's access list.
pub const MAX_GRANTS: usize = 256;

const FIXED_BYTES: usize = 56;
const FLAG_ENCRYPTED: u8 = 1;
const FLAG_MAX_CELLS: u8 = 2;
const FLAG_MAX_BYTES: u8 = 4;
const FLAG_MAX_EDGES: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_ENCRYPTED | FLAG_MAX_CELLS | FLAG_MAX_BYTES | FLAG_MAX_EDGES;

/// The id of the `default` namespace of a fresh data dir.
pub const DEFAULT_NAMESPACE_ID: u64 = 0;

/// Limits on what a namespace may hold; `None` is unlimited. Checked by the
/// writer before anything reaches the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    pub max_cells: Option<u64>,
    /// Bytes of cell values, programs, telemetry and edges ([`Usage::bytes`]).
    pub max_bytes: Option<u64>,
    pub max_edges: Option<u64>,
}

impl Quota {
    pub fn is_unlimited(&self) -> bool {
        self.max_cells.is_none() && self.max_bytes.is_none() && self.max_edges.is_none()
    }
}

/// One uid's access to a namespace besides its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub uid: u32,
    pub read_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceMeta {
    /// Unique forever in a data dir: the LSN of the creating record.
    pub id: u64,
    pub curve: Curve,
    pub quota: Quota,
    pub encrypted: bool,
    /// The uid that created it (for `default`: the daemon's uid).
    pub owner_uid: u32,
    /// Encrypted namespaces: derived from the master key and `id`; lets a
    /// start with the wrong key say so instead of reporting tampering.
    pub key_check: [u8; 16],
    /// Sorted by uid, at most [`MAX_GRANTS`], owner not included.
    pub grants: Vec<Grant>,
}

/// What a connection may do in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Not even learn that it exists.
    None,
    ReadOnly,
    ReadWrite,
    /// Owner or administrator: may also grant, revoke and drop.
    Admin,
}

impl NamespaceMeta {
    /// The metadata of a namespace nobody has configured: `default` on a
    /// fresh data dir, owned by `owner_uid` (the daemon's uid).
    pub fn implicit_default(owner_uid: u32) -> NamespaceMeta {
        NamespaceMeta {
            id: DEFAULT_NAMESPACE_ID,
            curve: Curve::DEFAULT,
            quota: Quota::default(),
            encrypted: false,
            owner_uid,
            key_check: [0; 16],
            grants: Vec::new(),
        }
    }

    /// `uid`'s access; `is_admin` for the daemon's own uid and root.
    pub fn access(&self, uid: u32, is_admin: bool) -> Access {
        if is_admin || uid == self.owner_uid {
            return Access::Admin;
        }
        match self.grants.iter().find(|g| g.uid == uid) {
            Some(Grant {
                read_only: true, ..
            }) => Access::ReadOnly,
            Some(_) => Access::ReadWrite,
            None => Access::None,
        }
    }

    /// Adds or updates `uid`'s grant. `false` if the list is full.
    pub fn grant(&mut self, grant: Grant) -> bool {
        match self.grants.binary_search_by_key(&grant.uid, |g| g.uid) {
            Ok(at) => self.grants[at] = grant,
            Err(at) => {
                if self.grants.len() >= MAX_GRANTS {
                    return false;
                }
                self.grants.insert(at, grant);
            }
        }
        true
    }

    /// Removes `uid`'s grant; `false` if it had none.
    pub fn revoke(&mut self, uid: u32) -> bool {
        match self.grants.binary_search_by_key(&uid, |g| g.uid) {
            Ok(at) => {
                self.grants.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    pub fn encoded_len(&self) -> usize {
        FIXED_BYTES + 5 * self.grants.len()
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(self.grants.len() <= MAX_GRANTS);
        let start = out.len();
        out.resize(start + FIXED_BYTES, 0);
        let b = &mut out[start..];
        LittleEndian::write_u64(&mut b[0..8], self.id);
        b[8] = match self.curve {
            Curve::Morton => 1,
            Curve::Hilbert => 2,
        };
        let mut flags = 0;
        if self.encrypted {
            flags |= FLAG_ENCRYPTED;
        }
        let limits = [
            (self.quota.max_cells, FLAG_MAX_CELLS, 14),
            (self.quota.max_bytes, FLAG_MAX_BYTES, 22),
            (self.quota.max_edges, FLAG_MAX_EDGES, 30),
        ];
        for (limit, flag, at) in limits {
            if let Some(limit) = limit {
                flags |= flag;
                LittleEndian::write_u64(&mut b[at..at + 8], limit);
            }
        }
        b[9] = flags;
        LittleEndian::write_u32(&mut b[10..14], self.owner_uid);
        b[38..54].copy_from_slice(&self.key_check);
        LittleEndian::write_u16(&mut b[54..56], self.grants.len() as u16);
        for grant in &self.grants {
            out.extend_from_slice(&grant.uid.to_le_bytes());
            out.push(u8::from(grant.read_only));
        }
    }

    /// Decodes metadata whose checksum already matched; an error means the
    /// bytes were not written by cube.
    pub fn decode(bytes: &[u8]) -> Result<NamespaceMeta, String> {
        if bytes.len() < FIXED_BYTES {
            return Err(format!(
                "namespace metadata of {} bytes, at least {FIXED_BYTES} expected",
                bytes.len()
            ));
        }
        let curve = match bytes[8] {
            1 => Curve::Morton,
            2 => Curve::Hilbert,
            other => return Err(format!("unknown curve {other} in namespace metadata")),
        };
        let flags = bytes[9];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(format!("unknown namespace flags 0x{flags:02x}"));
        }
        let limit = |flag: u8, at: usize| {
            (flags & flag != 0).then(|| LittleEndian::read_u64(&bytes[at..at + 8]))
        };
        let count = usize::from(LittleEndian::read_u16(&bytes[54..56]));
        if count > MAX_GRANTS || bytes.len() != FIXED_BYTES + 5 * count {
            return Err(format!(
                "namespace metadata with {count} grants has {} bytes",
                bytes.len()
            ));
        }
        let mut grants = Vec::with_capacity(count);
        for g in bytes[FIXED_BYTES..].chunks_exact(5) {
            let read_only = match g[4] {
                0 => false,
                1 => true,
                other => return Err(format!("grant flag {other} is not 0 or 1")),
            };
            grants.push(Grant {
                uid: LittleEndian::read_u32(&g[0..4]),
                read_only,
            });
        }
        if grants.windows(2).any(|w| w[0].uid >= w[1].uid) {
            return Err("namespace grants are not sorted by uid".into());
        }
        let mut key_check = [0u8; 16];
        key_check.copy_from_slice(&bytes[38..54]);
        Ok(NamespaceMeta {
            id: LittleEndian::read_u64(&bytes[0..8]),
            curve,
            quota: Quota {
                max_cells: limit(FLAG_MAX_CELLS, 14),
                max_bytes: limit(FLAG_MAX_BYTES, 22),
                max_edges: limit(FLAG_MAX_EDGES, 30),
            },
            encrypted: flags & FLAG_ENCRYPTED != 0,
            owner_uid: LittleEndian::read_u32(&bytes[10..14]),
            key_check,
            grants,
        })
    }
}

/// Which namespaces exist as of some LSN, by name and by id: what the
/// checkpointer needs to turn WAL records (which name namespaces) into
/// state entries (which carry ids), and loading needs the other way round.
#[derive(Clone, Debug, Default)]
pub struct NamespaceCatalog {
    by_name: BTreeMap<NamespaceName, NamespaceMeta>,
    names: HashMap<u64, NamespaceName>,
}

impl NamespaceCatalog {
    /// A fresh data dir: only `default`, id 0, owned by the administrators.
    pub fn with_implicit_default() -> NamespaceCatalog {
        let mut catalog = NamespaceCatalog::default();
        if let Ok(default) = NamespaceName::new("default") {
            catalog.apply(&Mutation::NamespaceCreate {
                ns: default,
                meta: NamespaceMeta::implicit_default(0),
            });
        }
        catalog
    }

    /// Applies a namespace record (anything else is ignored).
    pub fn apply(&mut self, mutation: &Mutation) {
        match mutation {
            Mutation::NamespaceCreate { ns, meta } | Mutation::NamespaceAlter { ns, meta } => {
                if let Some(old) = self.by_name.insert(ns.clone(), meta.clone()) {
                    self.names.remove(&old.id);
                }
                self.names.insert(meta.id, ns.clone());
            }
            Mutation::NamespaceDrop { ns } => {
                if let Some(old) = self.by_name.remove(ns) {
                    self.names.remove(&old.id);
                }
            }
            _ => {}
        }
    }

    pub fn get(&self, ns: &NamespaceName) -> Option<&NamespaceMeta> {
        self.by_name.get(ns)
    }

    pub fn name_of(&self, id: u64) -> Option<NamespaceName> {
        self.names.get(&id).cloned()
    }

    pub fn meta_of(&self, id: u64) -> Option<&NamespaceMeta> {
        self.by_name.get(self.names.get(&id)?)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&NamespaceName, &NamespaceMeta)> {
        self.by_name.iter()
    }
}

/// Refuses to go on with an encrypted namespace when there is no master
/// key, or not the one it was created with: better to stop with the
/// namespace's name than to report every record of it as tampered.
pub(crate) fn check_namespace_key(
    ns: &NamespaceName,
    meta: &NamespaceMeta,
    keyring: Option<&crate::crypto::Keyring>,
) -> Result<(), crate::error::StoreError> {
    if !meta.encrypted {
        return Ok(());
    }
    let Some(keyring) = keyring.filter(|k| k.has_key()) else {
        return Err(crate::error::StoreError::Key(format!(
            "namespace {:?} is encrypted and no master key was given; start cubed with --key-file PATH (the key it was created with)",
            ns.as_str()
        )));
    };
    match keyring.key_check(meta.id) {
        Ok(check) if check == meta.key_check => {
            keyring.mark_verified(meta.id);
            Ok(())
        }
        _ => Err(crate::error::StoreError::Key(format!(
            "namespace {:?} was encrypted with another master key than the one in --key-file; refusing to start (use the key it was created with)",
            ns.as_str()
        ))),
    }
}

/// What one edge counts against `max-bytes` (besides `max-edges`): its
/// two slots (out and in), key, label and weight.
pub const EDGE_CHARGE_BYTES: u64 = 64;

/// A namespace's current contents, for quotas and `ns info`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cells: u64,
    /// Bytes counted against `max-bytes`: cell values, plus each program's
    /// source and [`crate::programs::PROGRAM_OVERHEAD_BYTES`], each kept
    /// telemetry record ([`crate::programs::TELEMETRY_RECORD_CHARGE_BYTES`])
    /// and each edge ([`EDGE_CHARGE_BYTES`]).
    pub bytes: u64,
    pub edges: u64,
}

/// The change a group of writes makes to a [`Usage`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageDelta {
    pub cells: i64,
    pub bytes: i64,
    pub edges: i64,
}

impl UsageDelta {
    pub fn add(&mut self, other: UsageDelta) {
        self.cells += other.cells;
        self.bytes += other.bytes;
        self.edges += other.edges;
    }
}

/// Why a write was refused for a quota: which one, its limit, and the use
/// it would have reached.
pub fn check_quota(
    ns: &NamespaceName,
    quota: &Quota,
    usage: Usage,
    delta: UsageDelta,
) -> Result<(), String> {
    let after = |now: u64, change: i64| now.saturating_add_signed(change);
    let checks = [
        (
            "max-cells",
            quota.max_cells,
            usage.cells,
            delta.cells,
            "cells",
        ),
        (
            "max-bytes",
            quota.max_bytes,
            usage.bytes,
            delta.bytes,
            "bytes (values, programs, telemetry, edges)",
        ),
        (
            "max-edges",
            quota.max_edges,
            usage.edges,
            delta.edges,
            "edges",
        ),
    ];
    for (name, limit, now, change, unit) in checks {
        if let Some(limit) = limit
            && change > 0
            && after(now, change) > limit
        {
            return Err(format!(
                "namespace {:?} is over its {name} quota: it holds {now} {unit}, this write would make it {}, the limit is {limit}; nothing was applied",
                ns.as_str(),
                after(now, change)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_damage_is_refused() {
        let mut meta = NamespaceMeta {
            id: 77,
            curve: Curve::Hilbert,
            quota: Quota {
                max_cells: Some(10),
                max_bytes: None,
                max_edges: Some(0),
            },
            encrypted: true,
            owner_uid: 1000,
            key_check: [7; 16],
            grants: Vec::new(),
        };
        assert!(meta.grant(Grant {
            uid: 5,
            read_only: true
        }));
        assert!(meta.grant(Grant {
            uid: 2,
            read_only: false
        }));
        let mut out = Vec::new();
        meta.encode(&mut out);
        assert_eq!(out.len(), meta.encoded_len());
        assert_eq!(NamespaceMeta::decode(&out).unwrap(), meta);
        for cut in 0..out.len() {
            assert!(NamespaceMeta::decode(&out[..cut]).is_err());
        }
        assert_eq!(meta.access(5, false), Access::ReadOnly);
        assert_eq!(meta.access(2, false), Access::ReadWrite);
        assert_eq!(meta.access(3, false), Access::None);
        assert_eq!(meta.access(1000, false), Access::Admin);
        assert_eq!(meta.access(3, true), Access::Admin);
        assert!(meta.revoke(5) && !meta.revoke(5));
        assert_eq!(meta.access(5, false), Access::None);
    }

    #[test]
    fn quota_messages_name_the_quota_and_its_use() {
        let ns = NamespaceName::new("t").unwrap();
        let quota = Quota {
            max_cells: Some(2),
            ..Quota::default()
        };
        let usage = Usage {
            cells: 2,
            ..Usage::default()
        };
        let grow = UsageDelta {
            cells: 1,
            ..UsageDelta::default()
        };
        let err = check_quota(&ns, &quota, usage, grow).unwrap_err();
        assert!(
            err.contains("max-cells") && err.contains("holds 2"),
            "{err}"
        );
        // Shrinking is always allowed, even over the limit.
        let shrink = UsageDelta {
            cells: -1,
            ..UsageDelta::default()
        };
        assert!(check_quota(&ns, &quota, usage, shrink).is_ok());
    }
}
