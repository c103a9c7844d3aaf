//! The writer's first step on a group: check each write (namespace guard,
//! quotas, namespace limits) and run each transaction against the store
//! plus the group's earlier writes, before anything is logged.

use std::collections::HashMap;

use cube_protocol::NamespaceName;

use super::MAX_TXN_MUTATIONS;
use super::answer::{Responder, TxnAck};
use super::session::NamespaceGuard;
use super::writer::{Prepared, Queued, Writer};
use crate::error::{WriteError, WriteErrorKind};
use crate::memstore::MemStore;
use crate::mutation::Mutation;
use crate::namespace::{UsageDelta, check_quota};
use crate::transaction::{TxnFn, TxnView};

/// [`Writer::check_quota`], callable while a transaction borrows the overlay.
pub(crate) fn quota_check(
    mem: &MemStore,
    group_usage: &HashMap<NamespaceName, UsageDelta>,
    ns: &NamespaceName,
    delta: UsageDelta,
) -> Result<(), WriteError> {
    let Some(quota) = mem.namespace_quota(ns) else {
        return Ok(());
    };
    if quota.is_unlimited() {
        return Ok(());
    }
    let usage = mem.namespace_usage(ns).unwrap_or_default();
    let mut total = group_usage.get(ns).copied().unwrap_or_default();
    total.add(delta);
    check_quota(ns, &quota, usage, total)
        .map_err(|message| WriteError::new(WriteErrorKind::QuotaExceeded, message))
}

fn no_such_namespace(ns: &NamespaceName) -> WriteError {
    WriteError::new(
        WriteErrorKind::NoSuchNamespace,
        format!("no such namespace {:?}", ns.as_str()),
    )
}

impl Writer {
    /// Refuses a write that would take a quota-limited namespace past its
    /// quota, counting what this group already accepted.
    pub(super) fn check_quota(
        &self,
        ns: &NamespaceName,
        delta: UsageDelta,
    ) -> Result<(), WriteError> {
        quota_check(&self.mem, &self.group_usage, ns, delta)
    }

    /// A guarded write whose namespace is gone or is another one now.
    pub(super) fn guard_refusal(&self, guard: Option<&NamespaceGuard>) -> Option<WriteError> {
        let guard = guard?;
        (self.mem.namespace_id(&guard.ns) != Some(guard.id)).then(|| no_such_namespace(&guard.ns))
    }

    pub(super) fn namespace_limited(&self, ns: &NamespaceName) -> bool {
        self.mem
            .namespace_quota(ns)
            .is_some_and(|quota| !quota.is_unlimited())
    }

    /// Refuses a create past the namespaces its owner may hold.
    fn check_owner_limit(&self, owner_uid: u32) -> Result<(), WriteError> {
        let most = self.config.max_namespaces_per_owner;
        if most == usize::MAX || self.config.unlimited_owners.contains(&owner_uid) {
            return Ok(());
        }
        let owned = self.mem.namespaces_owned_by(owner_uid);
        if owned >= most {
            return Err(WriteError::new(
                WriteErrorKind::LimitExceeded,
                format!(
                    "uid {owner_uid} owns {owned} namespaces, the most one uid may \
                     (--max-namespaces-per-uid {most}); drop one (cubec ns drop NAME) first"
                ),
            ));
        }
        Ok(())
    }

    /// Checks a namespace create or drop against the store (it commits
    /// alone, so nothing earlier in its group can change the answer).
    pub(super) fn check_namespace_change(&self, mutation: &Mutation) -> Result<(), WriteError> {
        match mutation {
            Mutation::NamespaceCreate { ns, meta } => {
                if self.mem.has_namespace(ns) {
                    return Err(WriteError::new(
                        WriteErrorKind::NamespaceExists,
                        format!("namespace {:?} exists already", ns.as_str()),
                    ));
                }
                let count = self.mem.namespace_count();
                if count >= self.config.max_namespaces {
                    return Err(WriteError::new(
                        WriteErrorKind::QuotaExceeded,
                        format!(
                            "cubed holds {count} namespaces, its limit; drop one (cubec ns drop NAME) before creating another"
                        ),
                    ));
                }
                self.check_owner_limit(meta.owner_uid)?;
                if meta.encrypted && !self.keyring.as_ref().is_some_and(|k| k.has_key()) {
                    return Err(WriteError::new(
                        WriteErrorKind::EncryptionUnavailable,
                        "an encrypted namespace needs a master key: start cubed with --key-file PATH",
                    ));
                }
                Ok(())
            }
            Mutation::NamespaceDrop { ns } | Mutation::NamespaceAlter { ns, .. }
                if !self.mem.has_namespace(ns) =>
            {
                Err(no_such_namespace(ns))
            }
            _ => Ok(()),
        }
    }

    /// Checks each write, runs each transaction in order against the store
    /// plus the group's earlier writes, and returns the group's entries.
    pub(super) fn prepare(&mut self, group: &mut Vec<Queued>) -> Vec<Prepared> {
        let mut prepared: Vec<Prepared> = Vec::with_capacity(group.len());
        // The overlay is built only once a transaction needs it.
        let mut overlay_live = false;
        self.overlay.clear();
        self.group_usage.clear();
        for queued in group.drain(..) {
            match queued {
                Queued::Write {
                    mutation,
                    reply,
                    guard,
                } => {
                    match self.check_write(&mutation, guard.as_ref(), &prepared, &mut overlay_live)
                    {
                        Ok(()) => prepared.push(Prepared::Write {
                            mutation,
                            reply,
                            lsn: 0,
                        }),
                        Err(error) => reply.answer(Err(error)),
                    }
                }
                Queued::Txn { txn, reply, guard } => {
                    if let Some(entry) =
                        self.prepare_txn(txn, reply, guard.as_ref(), &prepared, &mut overlay_live)
                    {
                        prepared.push(entry);
                    }
                }
            }
        }
        prepared
    }

    /// Builds the overlay from the group's earlier entries, unless it is
    /// built already.
    fn build_overlay(&mut self, overlay_live: &mut bool, prepared: &[Prepared]) {
        if *overlay_live {
            return;
        }
        for entry in prepared {
            for earlier in entry.mutations() {
                self.overlay.record(&self.mem, earlier);
            }
        }
        *overlay_live = true;
    }

    /// Checks one write (guard, namespace, quota) against the store plus
    /// the group's earlier writes, and counts it in the group's usage.
    fn check_write(
        &mut self,
        mutation: &Mutation,
        guard: Option<&NamespaceGuard>,
        prepared: &[Prepared],
        overlay_live: &mut bool,
    ) -> Result<(), WriteError> {
        if let Some(error) = self.guard_refusal(guard) {
            return Err(error);
        }
        let ns = mutation.namespace();
        if mutation.is_namespace_change() {
            self.check_namespace_change(mutation)?;
        } else if !self.mem.has_namespace(ns) {
            return Err(no_such_namespace(ns));
        }
        if self.namespace_limited(ns) {
            // Quotas need the group's earlier writes to judge this one:
            // build the overlay now.
            self.build_overlay(overlay_live, prepared);
            let delta = self
                .overlay
                .usage_change(&self.mem, mutation)
                .map_err(|e| {
                    WriteError::new(
                        WriteErrorKind::StorageIo,
                        format!(
                            "the cell this write replaces could not be read to \
                             check the namespace's quota; nothing was written: {e}"
                        ),
                    )
                })?;
            self.check_quota(ns, delta)?;
            self.group_usage.entry(ns.clone()).or_default().add(delta);
        }
        if *overlay_live {
            self.overlay.record(&self.mem, mutation);
        }
        Ok(())
    }

    /// Runs a transaction against the store plus the group's earlier
    /// writes and returns its entry, or answers its refusal (rolled back).
    fn prepare_txn(
        &mut self,
        txn: TxnFn,
        reply: Responder<TxnAck>,
        guard: Option<&NamespaceGuard>,
        prepared: &[Prepared],
        overlay_live: &mut bool,
    ) -> Option<Prepared> {
        if let Some(error) = self.guard_refusal(guard) {
            reply.answer(Err(error));
            return None;
        }
        self.build_overlay(overlay_live, prepared);
        let mut view = TxnView::new(&self.mem, &mut self.overlay);
        view.set_earlier_usage(&self.group_usage);
        let output = txn(&mut view);
        if let Some(error) = txn_refusal(&view, &self.mem, &self.group_usage) {
            view.rollback();
            reply.answer(Err(error));
            return None;
        }
        for (ns, delta) in view.usage_changes() {
            self.group_usage.entry(ns.clone()).or_default().add(*delta);
        }
        Some(Prepared::Txn {
            mutations: view.into_mutations(),
            output,
            reply,
            first_lsn: 0,
        })
    }
}

/// Why a transaction that ran is refused: too many writes, a refused
/// read, a namespace that does not exist, or a quota it would exceed.
fn txn_refusal(
    view: &TxnView<'_>,
    mem: &MemStore,
    group_usage: &HashMap<NamespaceName, UsageDelta>,
) -> Option<WriteError> {
    let refusal = if view.emitted() > MAX_TXN_MUTATIONS {
        Some(WriteError::new(
            WriteErrorKind::Invalid,
            format!(
                "the transaction wrote {} cells, over the limit of {MAX_TXN_MUTATIONS}; nothing was applied",
                view.emitted()
            ),
        ))
    } else {
        None
    };
    let refusal = refusal.or_else(|| view.read_refusal());
    let refusal = refusal.or_else(|| {
        view.pending_namespaces()
            .find(|ns| !mem.has_namespace(ns))
            .map(no_such_namespace)
    });
    refusal.or_else(|| {
        view.usage_changes()
            .iter()
            .find_map(|(ns, delta)| quota_check(mem, group_usage, ns, *delta).err())
    })
}
