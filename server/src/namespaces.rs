//! `ns create | drop | list | info | grant | revoke`: namespaces as tenants.
//!
//! Creates and drops are ordinary logged writes (the store commits each in
//! a group of its own and gives the namespace an id nobody reuses). Grants
//! and revokes are writer transactions: they read the namespace's current
//! access list and log the whole new one, so two concurrent grants never
//! lose each other's change.

use cube_protocol::{
    CurveChoice, ErrorCode, NamespaceGrant, NamespaceInfo, NamespaceName, NamespaceSpec, Request,
    Response, ServerError,
};
use cube_store::namespace::{Access, Grant, NamespaceMeta, Quota};
use cube_store::{Curve, MemStore, Mutation, WriteSession};

use crate::access::{Peer, access_of};
use crate::connection::{no_such_namespace, write_error};

/// Answers one namespace request; `session` is the connection's writer
/// handle (`None` once shutdown began).
pub(crate) fn handle(
    request: Request,
    args: &crate::config::Args,
    peer: &Peer,
    mem: &MemStore,
    session: Option<&WriteSession>,
) -> Result<Response, ServerError> {
    match request {
        Request::NsCreate { ns, spec } => create(args, peer, mem, session, ns, &spec),
        Request::NsDrop { ns } => {
            let cells = mem.namespace_usage(&ns).map_or(0, |u| u.cells);
            let ack = writer(session)?
                .write(Mutation::NamespaceDrop { ns })
                .map_err(|e| write_error(&e))?;
            Ok(Response::NsDropped {
                lsn: ack.lsn,
                cells,
            })
        }
        Request::NsList => {
            let names = mem
                .namespace_list()
                .into_iter()
                .filter(|(_, meta)| meta.access(peer.uid, peer.is_admin) != Access::None)
                .map(|(name, _)| name)
                .take(cube_protocol::MAX_LISTED_NAMESPACES)
                .collect();
            Ok(Response::NsList(names))
        }
        Request::NsInfo { ns } => Ok(Response::NsInfo(info(mem, &ns)?)),
        Request::NsGrant { ns, uid, read_only } => {
            grant(mem, session, ns, Grant { uid, read_only })
        }
        Request::NsRevoke { ns, uid } => revoke(mem, session, ns, uid),
        _ => Err(ServerError::new(
            ErrorCode::Internal,
            "not a namespace request",
        )),
    }
    .and_then(|response| {
        // A namespace the caller may no longer see (a revoke of its own
        // grant) is not described back to it.
        if let Response::NsGranted(info) | Response::NsRevoked(info) = &response
            && access_of(peer, mem, &info.name) == Access::None
        {
            return Err(no_such_namespace(&info.name));
        }
        Ok(response)
    })
}

/// The connection's writer handle, or why there is none.
fn writer(session: Option<&WriteSession>) -> Result<&WriteSession, ServerError> {
    session.ok_or_else(|| {
        ServerError::new(
            ErrorCode::ShuttingDown,
            "cubed is shutting down; nothing was changed",
        )
    })
}

/// `ns create`, for a uid `--ns-create-uids` allows.
fn create(
    args: &crate::config::Args,
    peer: &Peer,
    mem: &MemStore,
    session: Option<&WriteSession>,
    ns: NamespaceName,
    spec: &NamespaceSpec,
) -> Result<Response, ServerError> {
    if !peer.is_admin && !args.ns_create_uids.allows(peer.uid) {
        return Err(ServerError::new(
            ErrorCode::PermissionDenied,
            format!(
                "uid {} may not create namespaces on this daemon (--ns-create-uids); \
                 ask its operator for one, or for a grant on an existing namespace",
                peer.uid
            ),
        ));
    }
    let meta = new_meta(spec, peer.uid);
    writer(session)?
        .write(Mutation::NamespaceCreate {
            ns: ns.clone(),
            meta,
        })
        .map_err(|e| write_error(&e))?;
    Ok(Response::NsCreated(info(mem, &ns)?))
}

/// `ns grant`, refused past the namespace's most grants.
fn grant(
    mem: &MemStore,
    session: Option<&WriteSession>,
    ns: NamespaceName,
    grant: Grant,
) -> Result<Response, ServerError> {
    let name = ns.as_str().to_string();
    alter(writer(session)?, &ns, move |meta| {
        if meta.grant(grant) {
            Ok(())
        } else {
            Err(ServerError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "namespace {name:?} already has {} grants, the most it may have; revoke one first",
                    cube_store::namespace::MAX_GRANTS
                ),
            ))
        }
    })?;
    Ok(Response::NsGranted(info(mem, &ns)?))
}

/// `ns revoke`, refused for a uid with no grant.
fn revoke(
    mem: &MemStore,
    session: Option<&WriteSession>,
    ns: NamespaceName,
    uid: u32,
) -> Result<Response, ServerError> {
    alter(writer(session)?, &ns, move |meta| {
        if meta.revoke(uid) {
            Ok(())
        } else {
            Err(ServerError::new(
                ErrorCode::InvalidArgument,
                format!("uid {uid} has no grant in this namespace; nothing to revoke"),
            ))
        }
    })?;
    Ok(Response::NsRevoked(info(mem, &ns)?))
}

fn new_meta(spec: &NamespaceSpec, owner_uid: u32) -> NamespaceMeta {
    NamespaceMeta {
        // Set by the writer to the creating record's LSN.
        id: 0,
        curve: match spec.curve {
            CurveChoice::ServerDefault => Curve::DEFAULT,
            CurveChoice::Morton => Curve::Morton,
            CurveChoice::Hilbert => Curve::Hilbert,
        },
        quota: Quota {
            max_cells: spec.max_cells,
            max_bytes: spec.max_bytes,
            max_edges: spec.max_edges,
        },
        encrypted: spec.encrypted,
        owner_uid,
        key_check: [0; 16],
        grants: Vec::new(),
    }
}

/// Changes a namespace's metadata on the writer, against its latest state.
fn alter(
    session: &WriteSession,
    ns: &NamespaceName,
    change: impl FnOnce(&mut NamespaceMeta) -> Result<(), ServerError> + Send + 'static,
) -> Result<(), ServerError> {
    let target = ns.clone();
    let (outcome, _lsn) = session
        .transact(move |view| {
            let Some(mut meta) = view.namespace_meta(&target) else {
                return Err(no_such_namespace(&target));
            };
            change(&mut meta)?;
            view.emit(Mutation::NamespaceAlter { ns: target, meta });
            Ok(())
        })
        .map_err(|e| write_error(&e))?;
    outcome
}

/// Most namespaces listed one by one in `stats` (the rest are summed).
const MAX_STATS_NAMESPACES: usize = 256;

/// `stats` lines per namespace the peer may see: `ns.NAME.cells`, `.bytes`,
/// `.edges`, `.programs`, plus, for an administrator, the daemon's resident
/// memory (it grows with every tenant's data, so a tenant does not see it).
pub(crate) fn stats_entries(peer: &Peer, mem: &MemStore) -> Vec<cube_protocol::StatsEntry> {
    use crate::connection::count;
    let mut entries = Vec::new();
    if peer.is_admin
        && let Some(rss) = resident_bytes()
    {
        entries.push(count("memory.resident_bytes", rss));
    }
    let visible: Vec<NamespaceName> = mem
        .namespace_list()
        .into_iter()
        .filter(|(_, meta)| meta.access(peer.uid, peer.is_admin) != Access::None)
        .map(|(name, _)| name)
        .collect();
    entries.push(count("namespaces", visible.len() as u64));
    for ns in visible.iter().take(MAX_STATS_NAMESPACES) {
        let usage = mem.namespace_usage(ns).unwrap_or_default();
        let name = ns.as_str();
        entries.extend([
            count(&format!("ns.{name}.cells"), usage.cells),
            count(&format!("ns.{name}.bytes"), usage.bytes),
            count(&format!("ns.{name}.edges"), usage.edges),
            count(&format!("ns.{name}.programs"), mem.program_count_in(ns)),
        ]);
    }
    entries
}

/// Resident set size from `/proc/self/statm` (Linux); `None` elsewhere.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // The page size is 4 KiB on every platform cube targets; reading it
    // exactly would need sysconf (unsafe or another crate).
    Some(pages * 4096)
}

/// `ns info`: settings, use and access list.
pub(crate) fn info(mem: &MemStore, ns: &NamespaceName) -> Result<NamespaceInfo, ServerError> {
    let meta = mem
        .namespace_meta(ns)
        .ok_or_else(|| no_such_namespace(ns))?;
    let usage = mem.namespace_usage(ns).unwrap_or_default();
    Ok(NamespaceInfo {
        name: ns.clone(),
        id: meta.id,
        curve: match meta.curve {
            Curve::Morton => CurveChoice::Morton,
            Curve::Hilbert => CurveChoice::Hilbert,
        },
        encrypted: meta.encrypted,
        owner_uid: meta.owner_uid,
        cells: usage.cells,
        bytes: usage.bytes,
        edges: usage.edges,
        programs: mem.program_count_in(ns),
        max_cells: meta.quota.max_cells,
        max_bytes: meta.quota.max_bytes,
        max_edges: meta.quota.max_edges,
        grants: meta
            .grants
            .iter()
            .map(|g| NamespaceGrant {
                uid: g.uid,
                read_only: g.read_only,
            })
            .collect(),
    })
}
