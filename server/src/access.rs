//! Who is on the other end of a connection, and what they may do.
//!
//! The daemon learns each connection's peer uid and gid from the kernel
//! (`SO_PEERCRED`), never from anything the client says. Three gates:
//! 1. The socket file's mode (`--socket-mode`, 0600 by default).
//! 2. At accept: with `--allow-uid` / `--allow-gid` given, only those uids
//!    and gids (plus the administrators) are served.
//! 3. Per request: a namespace's owner and access list decide. The
//!    daemon's own uid and root are administrators: they see and may do
//!    everything. A connection without a grant gets exactly the error a
//!    missing namespace gets, so it cannot even learn that one exists.

use std::os::unix::net::UnixStream;

use cube_protocol::{ErrorCode, NamespaceName, Request, ServerError};
use cube_store::namespace::Access;
use cube_store::{MemStore, NamespaceGuard};

use crate::config::Args;
use crate::connection::no_such_namespace;

/// The kernel's word on who connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub uid: u32,
    pub gid: u32,
    /// The daemon's own uid, or root.
    pub is_admin: bool,
}

impl Peer {
    /// Reads `SO_PEERCRED`. An error (not a Unix socket?) refuses the
    /// connection rather than guessing.
    pub(crate) fn of(stream: &UnixStream) -> std::io::Result<Peer> {
        let creds =
            nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
                .map_err(std::io::Error::from)?;
        let uid = creds.uid();
        Ok(Peer {
            uid,
            gid: creds.gid(),
            is_admin: uid == 0 || uid == daemon_uid(),
        })
    }

    /// Gate 2: whether `--allow-uid` / `--allow-gid` let this peer in.
    pub(crate) fn allowed_by(&self, args: &Args) -> bool {
        if self.is_admin || (args.allow_uid.is_empty() && args.allow_gid.is_empty()) {
            return true;
        }
        args.allow_uid.contains(&self.uid) || args.allow_gid.contains(&self.gid)
    }
}

/// The uid `cubed` runs as.
pub(crate) fn daemon_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// What a request needs in the namespace it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    Read,
    Write,
    /// Drop, grant, revoke: the owner or an administrator.
    Admin,
}

/// The namespace a request names and what it needs there; `None` for
/// requests that name none (hello, ping, stats, ns list, ns create...).
fn target(request: &Request) -> Option<(&NamespaceName, Needs)> {
    use Needs::*;
    Some(match request {
        Request::Get { ns, .. }
        | Request::Mget { ns, .. }
        | Request::Scan { ns, .. }
        | Request::Edges { ns, .. }
        | Request::Walk { ns, .. }
        | Request::Path { ns, .. }
        | Request::CellStats { ns, .. }
        | Request::EdgeList { ns, .. }
        | Request::ProgramList { ns, .. }
        | Request::Watch { ns, .. }
        | Request::NsInfo { ns } => (ns, Read),
        Request::Put { ns, .. }
        | Request::Del { ns, .. }
        | Request::Link { ns, .. }
        | Request::Unlink { ns, .. }
        | Request::Detach { ns, .. }
        | Request::Prog { ns, .. }
        | Request::Run { ns, .. }
        | Request::Step { ns, .. }
        | Request::Batch { ns, .. } => (ns, Write),
        Request::NsDrop { ns } | Request::NsGrant { ns, .. } | Request::NsRevoke { ns, .. } => {
            (ns, Admin)
        }
        Request::Hello { .. }
        | Request::Ping
        | Request::Stats
        | Request::Checkpoint { .. }
        | Request::Backup { .. }
        | Request::NsCreate { .. }
        | Request::NsList => return None,
    })
}

/// Gate 3: refuses what `peer` may not do. A namespace the peer may not
/// see is answered exactly like a missing one. For a non-administrator the
/// answer pins the namespace it was allowed into (its id), so the writer
/// refuses the request if that namespace is dropped, or replaced by one of
/// the same name, before the request reaches it.
pub(crate) fn authorize(
    peer: &Peer,
    mem: &MemStore,
    request: &Request,
) -> Result<Option<NamespaceGuard>, ServerError> {
    if peer.is_admin {
        return Ok(None);
    }
    if matches!(request, Request::Checkpoint { .. } | Request::Backup { .. }) {
        return Err(ServerError::new(
            ErrorCode::PermissionDenied,
            format!(
                "only an administrator (root or the daemon's uid {}) may do this; your uid is {}",
                daemon_uid(),
                peer.uid
            ),
        ));
    }
    let Some((ns, needs)) = target(request) else {
        return Ok(None);
    };
    // One lookup for both the access and the id the answer pins: with two,
    // a drop and re-create of the name in between would pin the new
    // namespace, which this peer was never allowed into.
    let meta = mem.namespace_meta(ns);
    let access = meta
        .as_ref()
        .map_or(Access::None, |meta| meta.access(peer.uid, peer.is_admin));
    let allowed = match needs {
        Needs::Read => access >= Access::ReadOnly,
        Needs::Write => access >= Access::ReadWrite,
        Needs::Admin => access >= Access::Admin,
    };
    if allowed {
        return Ok(meta.map(|meta| NamespaceGuard {
            ns: ns.clone(),
            id: meta.id,
        }));
    }
    if access == Access::None {
        return Err(no_such_namespace(ns));
    }
    let what = match needs {
        Needs::Write => format!("your uid {} has a read-only grant", peer.uid),
        _ => format!(
            "only the namespace's owner or an administrator may do this; your uid is {}",
            peer.uid
        ),
    };
    Err(ServerError::new(
        ErrorCode::PermissionDenied,
        format!("not allowed in namespace {:?}: {what}", ns.as_str()),
    ))
}

/// What `peer` may do in `ns` (`Access::None` also when it does not exist).
pub(crate) fn access_of(peer: &Peer, mem: &MemStore, ns: &NamespaceName) -> Access {
    match mem.namespace_meta(ns) {
        Some(meta) => meta.access(peer.uid, peer.is_admin),
        None => Access::None,
    }
}
