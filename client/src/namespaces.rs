//! [`Client`] methods for namespaces: `ns_create`, `ns_drop`, `ns_list`,
//! `ns_info`, `ns_grant` and `ns_revoke` (`docs/protocol.md` section 6.9).
//! Names are [`NamespaceName`]s, so the naming rules are checked before
//! anything is sent.

use cube_protocol::{NamespaceInfo, NamespaceName, NamespaceSpec, Request, Response};

use crate::client::Client;
use crate::error::ClientError;

fn unexpected(what: &str, response: &Response) -> ClientError {
    ClientError::UnexpectedResponse(format!(
        "{} answer to a {what} request",
        response.opcode().name()
    ))
}

impl Client {
    /// Creates the namespace `ns` as `spec` asks (curve, quotas,
    /// encryption), owned by this connection's uid; returns its
    /// description. A name in use is a server error with code
    /// `namespace_exists`; an encrypted namespace on a daemon without
    /// `--key-file`, `encryption_unavailable`.
    pub fn ns_create(
        &mut self,
        ns: &NamespaceName,
        spec: &NamespaceSpec,
    ) -> Result<NamespaceInfo, ClientError> {
        let request = Request::NsCreate {
            ns: ns.clone(),
            spec: *spec,
        };
        match self.call(&request)? {
            Response::NsCreated(info) => Ok(info),
            other => Err(unexpected("ns-create", &other)),
        }
    }

    /// Drops `ns` and everything in it, durably; the name can be created
    /// again afterwards. Returns the drop's LSN and how many values went
    /// with it.
    pub fn ns_drop(&mut self, ns: &NamespaceName) -> Result<(u64, u64), ClientError> {
        match self.call(&Request::NsDrop { ns: ns.clone() })? {
            Response::NsDropped { lsn, cells } => Ok((lsn, cells)),
            other => Err(unexpected("ns-drop", &other)),
        }
    }

    /// The namespaces this connection may see, sorted by name.
    pub fn ns_list(&mut self) -> Result<Vec<NamespaceName>, ClientError> {
        match self.call(&Request::NsList)? {
            Response::NsList(names) => Ok(names),
            other => Err(unexpected("ns-list", &other)),
        }
    }

    /// `ns`'s settings, use (cells, bytes, edges, programs) and access list.
    pub fn ns_info(&mut self, ns: &NamespaceName) -> Result<NamespaceInfo, ClientError> {
        match self.call(&Request::NsInfo { ns: ns.clone() })? {
            Response::NsInfo(info) => Ok(info),
            other => Err(unexpected("ns-info", &other)),
        }
    }

    /// Gives `uid` read-only or read-write access to `ns`, replacing any
    /// grant it had; returns the namespace's new description. Only the
    /// owner or an administrator may (`permission_denied` otherwise).
    pub fn ns_grant(
        &mut self,
        ns: &NamespaceName,
        uid: u32,
        read_only: bool,
    ) -> Result<NamespaceInfo, ClientError> {
        let request = Request::NsGrant {
            ns: ns.clone(),
            uid,
            read_only,
        };
        match self.call(&request)? {
            Response::NsGranted(info) => Ok(info),
            other => Err(unexpected("ns-grant", &other)),
        }
    }

    /// Takes `uid`'s access to `ns` away; returns the namespace's new
    /// description.
    pub fn ns_revoke(
        &mut self,
        ns: &NamespaceName,
        uid: u32,
    ) -> Result<NamespaceInfo, ClientError> {
        match self.call(&Request::NsRevoke {
            ns: ns.clone(),
            uid,
        })? {
            Response::NsRevoked(info) => Ok(info),
            other => Err(unexpected("ns-revoke", &other)),
        }
    }
}

#[cfg(test)]
mod tests {
    //! A scripted fake daemon on a real socket: each method sends the
    //! request it names and understands the answer to it, and only that
    //! answer.

    use std::io::Write;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::thread;

    use cube_protocol::frame;
    use cube_protocol::{
        CurveChoice, ErrorCode, Limits, NamespaceGrant, PROTOCOL_VERSION, ServerError,
    };

    use super::*;

    fn ns(name: &str) -> NamespaceName {
        NamespaceName::new(name).unwrap()
    }

    fn info(grants: Vec<NamespaceGrant>) -> NamespaceInfo {
        NamespaceInfo {
            name: ns("tenant-a"),
            id: 2,
            curve: CurveChoice::Hilbert,
            encrypted: false,
            owner_uid: 1000,
            cells: 0,
            bytes: 0,
            edges: 0,
            programs: 0,
            max_cells: Some(10),
            max_bytes: None,
            max_edges: None,
            grants,
        }
    }

    fn read_request(stream: &mut UnixStream) -> (u64, Request) {
        let mut body = Vec::new();
        let header = frame::read_frame(stream, &Limits::default(), &mut body).unwrap();
        header.verify_body(&body).unwrap();
        let request = Request::decode(&header, &body, &Limits::default()).unwrap();
        (header.request_id, request)
    }

    fn send(stream: &mut UnixStream, response: &Response, request_id: u64) {
        let mut out = Vec::new();
        response.encode(request_id, &mut out);
        stream.write_all(&out).unwrap();
    }

    /// The requests the test's calls send, each with the answer the fake
    /// daemon gives it.
    fn script(reader: NamespaceGrant) -> Vec<(Request, Result<Response, ServerError>)> {
        vec![
            (
                Request::NsCreate {
                    ns: ns("tenant-a"),
                    spec: NamespaceSpec {
                        curve: CurveChoice::Hilbert,
                        max_cells: Some(10),
                        ..NamespaceSpec::default()
                    },
                },
                Ok(Response::NsCreated(info(Vec::new()))),
            ),
            (
                Request::NsCreate {
                    ns: ns("tenant-a"),
                    spec: NamespaceSpec::default(),
                },
                Err(ServerError::new(
                    ErrorCode::NamespaceExists,
                    "namespace tenant-a exists",
                )),
            ),
            (
                Request::NsList,
                Ok(Response::NsList(vec![ns("default"), ns("tenant-a")])),
            ),
            (
                Request::NsGrant {
                    ns: ns("tenant-a"),
                    uid: 1001,
                    read_only: true,
                },
                Ok(Response::NsGranted(info(vec![reader]))),
            ),
            (
                Request::NsInfo { ns: ns("tenant-a") },
                Ok(Response::NsInfo(info(vec![reader]))),
            ),
            (
                Request::NsRevoke {
                    ns: ns("tenant-a"),
                    uid: 1001,
                },
                Ok(Response::NsRevoked(info(Vec::new()))),
            ),
            (
                Request::NsDrop { ns: ns("tenant-a") },
                Ok(Response::NsDropped { lsn: 9, cells: 3 }),
            ),
            // An answer to some other request is not taken for this one.
            (
                Request::NsInfo { ns: ns("tenant-a") },
                Ok(Response::NsGranted(info(Vec::new()))),
            ),
        ]
    }

    /// A fake daemon on `listener` that answers one client's hello, then
    /// checks each request against `expected` and gives its answer.
    fn fake_daemon(
        listener: UnixListener,
        expected: Vec<(Request, Result<Response, ServerError>)>,
    ) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let (id, _) = read_request(&mut s);
            let hello = Response::Hello {
                protocol_version: PROTOCOL_VERSION,
                server_version: "fake/1".to_owned(),
                max_frame_bytes: Limits::DEFAULT_MAX_FRAME_BYTES,
                max_value_bytes: Limits::DEFAULT_MAX_VALUE_BYTES,
            };
            send(&mut s, &hello, id);
            for (want, answer) in expected {
                let (id, got) = read_request(&mut s);
                assert_eq!(got, want);
                match answer {
                    Ok(response) => send(&mut s, &response, id),
                    Err(error) => {
                        let mut out = Vec::new();
                        Response::encode_error(got.opcode() as u16, id, &error, &mut out);
                        s.write_all(&out).unwrap();
                    }
                }
            }
        })
    }

    #[test]
    fn namespace_methods_send_their_requests_and_read_their_answers() {
        let reader = NamespaceGrant {
            uid: 1001,
            read_only: true,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = fake_daemon(listener, script(reader));

        let mut client = Client::connect(&path).unwrap();
        let spec = NamespaceSpec {
            curve: CurveChoice::Hilbert,
            max_cells: Some(10),
            ..NamespaceSpec::default()
        };
        assert_eq!(
            client.ns_create(&ns("tenant-a"), &spec).unwrap(),
            info(Vec::new())
        );
        let err = client
            .ns_create(&ns("tenant-a"), &NamespaceSpec::default())
            .unwrap_err();
        assert_eq!(err.server_code(), Some(ErrorCode::NamespaceExists));
        assert_eq!(
            client.ns_list().unwrap(),
            vec![ns("default"), ns("tenant-a")]
        );
        assert_eq!(
            client.ns_grant(&ns("tenant-a"), 1001, true).unwrap().grants,
            vec![reader]
        );
        assert_eq!(
            client.ns_info(&ns("tenant-a")).unwrap().grants,
            vec![reader]
        );
        assert!(
            client
                .ns_revoke(&ns("tenant-a"), 1001)
                .unwrap()
                .grants
                .is_empty()
        );
        assert_eq!(client.ns_drop(&ns("tenant-a")).unwrap(), (9, 3));
        let err = client.ns_info(&ns("tenant-a")).unwrap_err();
        assert!(matches!(err, ClientError::UnexpectedResponse(_)), "{err:?}");
        server.join().unwrap();
    }
}
