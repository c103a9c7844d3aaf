//! Which records must be sealed: every data record of an encrypted
//! namespace, and none of any other.
//!
//! Why: a record's sealed bit, and the `encrypted` flag in a namespace's
//! metadata, are only CRC-checked, so someone who can write the data dir
//! but has no key could put a plaintext record in place of a sealed one
//! (its content would be taken as the namespace's), or clear the flag (and
//! the sealed records already written would still open, while new writes
//! went to disk in clear). Checking each record against the namespace's
//! flag at that point of the log refuses both, as corruption. It cannot
//! catch a flag cleared before the namespace had any data: the metadata is
//! not authenticated (`docs/storage-format.md`, "Key check").

use std::collections::HashMap;

use cube_protocol::NamespaceName;

use crate::mutation::Mutation;

/// The namespaces' `encrypted` flags as the log goes by.
#[derive(Default)]
pub struct SealingRule {
    encrypted: HashMap<NamespaceName, bool>,
}

impl SealingRule {
    /// A rule that starts from these namespaces (their state at the
    /// checkpoint the log continues); namespaces it does not know yet are
    /// learnt from the log's create records and not checked before.
    pub fn new(namespaces: impl IntoIterator<Item = (NamespaceName, bool)>) -> SealingRule {
        SealingRule {
            encrypted: namespaces.into_iter().collect(),
        }
    }

    /// Checks one record, in log order, and follows its namespace changes.
    pub fn check(&mut self, mutation: &Mutation, sealed: bool) -> Result<(), String> {
        match mutation {
            Mutation::NamespaceCreate { ns, meta } | Mutation::NamespaceAlter { ns, meta } => {
                self.encrypted.insert(ns.clone(), meta.encrypted);
                Ok(())
            }
            Mutation::NamespaceDrop { ns } => {
                self.encrypted.remove(ns);
                Ok(())
            }
            other => {
                let ns = other.namespace();
                match self.encrypted.get(ns) {
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
    use crate::namespace::NamespaceMeta;
    use cube_protocol::Coord;

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
        let mut rule = SealingRule::new([(secret.clone(), true), (plain.clone(), false)]);
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
        let mut meta = NamespaceMeta::implicit_default(0);
        meta.encrypted = true;
        let create = Mutation::NamespaceCreate {
            ns: new.clone(),
            meta,
        };
        rule.check(&create, false).unwrap();
        assert!(rule.check(&put(&new), false).is_err());
        rule.check(&Mutation::NamespaceDrop { ns: new.clone() }, false)
            .unwrap();
        assert!(rule.check(&put(&new), false).is_ok());
    }
}
