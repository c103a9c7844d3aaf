//! Which units must be sealed, and which namespace changes are refused
//! because they would change that answer.
//!
//! One source of truth: [`must_seal`] says whether a namespace's records
//! and checkpoint blocks are sealed. The writer (through the namespace's
//! creation flag, `memstore.rs`), recovery and the fold (through
//! [`SealingRule`]), compaction and the checkpoint loader
//! (`checkpoint/mod.rs`) all ask it, and none of them can disagree,
//! because the flag it reads can never change after creation: every
//! reader refuses a namespace record that changes `encrypted`, the key
//! check or the id of a namespace that exists ([`check_meta_change`]).
//!
//! Why: the `encrypted` flag in a namespace record is not secret, and in a
//! data dir whose log is not chained (no master key; segments older than
//! format version 3) it is only CRC-checked. Someone who can write the data
//! dir but has no key could otherwise append a `NamespaceAlter` that clears
//! it: recovery would accept it, the next fold would write the namespace's
//! data to a plaintext checkpoint, and later writes would go to the log in
//! clear. Checking each record against the namespace's flag at that point
//! of the log also refuses a plaintext record put in place of a sealed one.

use std::collections::HashMap;

use cube_protocol::NamespaceName;

use crate::mutation::Mutation;
use crate::namespace::NamespaceMeta;

/// Whether the records and checkpoint blocks of a namespace with this
/// metadata are sealed.
pub fn must_seal(meta: &NamespaceMeta) -> bool {
    meta.encrypted
}

/// Refuses a namespace record that changes what decides sealing: an alter
/// (or, in a checkpoint, an entry with the same id) that changes
/// `encrypted`, the key check or the id of a namespace that exists. A
/// record that creates a namespace under a new id is a drop and a create,
/// which is allowed (the old id's data is never read again).
pub fn check_meta_change(
    ns: &NamespaceName,
    old: &NamespaceMeta,
    new: &NamespaceMeta,
    is_alter: bool,
) -> Result<(), String> {
    if old.id != new.id {
        if is_alter {
            return Err(format!(
                "a record that alters namespace {:?} changes its id from {} to {}: cubed never \
                 does that, so the record was written by something else",
                ns.as_str(),
                old.id,
                new.id
            ));
        }
        return Ok(());
    }
    if must_seal(old) != must_seal(new) || old.key_check != new.key_check {
        return Err(format!(
            "a record changes the encryption of namespace {:?} (encrypted {} -> {}{}): \
             encryption is fixed when a namespace is created, so the record was written by \
             something else (the metadata was altered)",
            ns.as_str(),
            must_seal(old),
            must_seal(new),
            if old.key_check != new.key_check {
                ", key check changed"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// The namespaces' metadata as the log goes by.
#[derive(Default)]
pub struct SealingRule {
    namespaces: HashMap<NamespaceName, NamespaceMeta>,
}

impl SealingRule {
    /// A rule that starts from these namespaces (their state at the
    /// checkpoint the log continues); namespaces it does not know yet are
    /// learnt from the log's create records and not checked before.
    pub fn new(
        namespaces: impl IntoIterator<Item = (NamespaceName, NamespaceMeta)>,
    ) -> SealingRule {
        SealingRule {
            namespaces: namespaces.into_iter().collect(),
        }
    }

    /// Checks one record, in log order, and follows its namespace changes.
    pub fn check(&mut self, mutation: &Mutation, sealed: bool) -> Result<(), String> {
        match mutation {
            Mutation::NamespaceCreate { ns, meta } => {
                self.namespaces.insert(ns.clone(), meta.clone());
                Ok(())
            }
            Mutation::NamespaceAlter { ns, meta } => {
                if let Some(old) = self.namespaces.get(ns) {
                    check_meta_change(ns, old, meta, true)?;
                }
                self.namespaces.insert(ns.clone(), meta.clone());
                Ok(())
            }
            Mutation::NamespaceDrop { ns } => {
                self.namespaces.remove(ns);
                Ok(())
            }
            other => {
                let ns = other.namespace();
                match self.namespaces.get(ns).map(must_seal) {
                    Some(true) if !sealed => Err(format!(
                        "an unsealed record in encrypted namespace {:?}: cubed seals every record \
                         of it, so this one was written by something else",
                        ns.as_str()
                    )),
                    Some(false) if sealed => Err(format!(
                        "a sealed record in namespace {:?}, whose metadata says it is not \
                         encrypted: the metadata was altered",
                        ns.as_str()
                    )),
                    _ => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use cube_protocol::Coord;

    fn meta(id: u64, encrypted: bool) -> NamespaceMeta {
        let mut meta = NamespaceMeta::implicit_default(0);
        meta.id = id;
        meta.encrypted = encrypted;
        if encrypted {
            meta.key_check = [7; 16];
        }
        meta
    }

    fn put(ns: &NamespaceName) -> Mutation {
        Mutation::Put {
            ns: ns.clone(),
            coord: Coord::new(1, 2, 3),
            value: b"v".to_vec(),
        }
    }

    #[test]
    fn records_must_be_sealed_exactly_in_encrypted_namespaces() {
        let (secret, plain, new) = (
            NamespaceName::new("secret").unwrap(),
            NamespaceName::new("plain").unwrap(),
            NamespaceName::new("new").unwrap(),
        );
        let mut rule = SealingRule::new([
            (secret.clone(), meta(1, true)),
            (plain.clone(), meta(2, false)),
        ]);
        assert!(rule.check(&put(&secret), true).is_ok());
        assert!(
            rule.check(&put(&secret), false)
                .unwrap_err()
                .contains("unsealed")
        );
        assert!(rule.check(&put(&plain), false).is_ok());
        assert!(
            rule.check(&put(&plain), true)
                .unwrap_err()
                .contains("altered")
        );
        // Unknown namespaces are not judged; created ones are.
        assert!(rule.check(&put(&new), true).is_ok());
        let create = Mutation::NamespaceCreate {
            ns: new.clone(),
            meta: meta(3, true),
        };
        rule.check(&create, false).unwrap();
        assert!(rule.check(&put(&new), false).is_err());
        rule.check(&Mutation::NamespaceDrop { ns: new.clone() }, false)
            .unwrap();
        assert!(rule.check(&put(&new), false).is_ok());
    }

    /// The downgrade found by review: an alter that clears `encrypted` (or
    /// changes the key check or the id) of an existing namespace is
    /// refused, whether or not the namespace holds data yet; an alter of
    /// anything else (quota, grants) passes.
    #[test]
    fn an_alter_cannot_change_what_decides_sealing() {
        let secret = NamespaceName::new("secret").unwrap();
        let mut rule = SealingRule::new([(secret.clone(), meta(5, true))]);
        let alter = |meta: NamespaceMeta| Mutation::NamespaceAlter {
            ns: secret.clone(),
            meta,
        };
        let cleared = meta(5, false);
        let err = rule.check(&alter(cleared), false).unwrap_err();
        assert!(
            err.contains("encryption of namespace") && err.contains("altered"),
            "{err}"
        );
        let mut rekeyed = meta(5, true);
        rekeyed.key_check = [8; 16];
        assert!(
            rule.check(&alter(rekeyed), false)
                .unwrap_err()
                .contains("key check")
        );
        let moved = meta(6, true);
        assert!(
            rule.check(&alter(moved), false)
                .unwrap_err()
                .contains("its id")
        );
        let mut granted = meta(5, true);
        granted.owner_uid = 4242;
        rule.check(&alter(granted), false).unwrap();
        // Still encrypted after all that: a plaintext put is refused.
        assert!(rule.check(&put(&secret), false).is_err());
        // A drop and a create under a new id may change it.
        rule.check(&Mutation::NamespaceDrop { ns: secret.clone() }, false)
            .unwrap();
        rule.check(
            &Mutation::NamespaceCreate {
                ns: secret.clone(),
                meta: meta(9, false),
            },
            false,
        )
        .unwrap();
        rule.check(&put(&secret), false).unwrap();
    }
}
