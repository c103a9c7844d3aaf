//! [`Client`] methods for moving data in and out in bulk: `batch` (many
//! writes, atomically) for `cubec import`, and the `edge-list` and
//! `prog-list` pages that `cubec export` reads besides `scan`
//! (`docs/protocol.md` section 6.8).
//!
//! Batch limits are checked here before anything is sent, so a batch that
//! could never be accepted is a [`ClientError::BadArgument`] whose message,
//! like the server's, starts with `op N` when one operation is to blame
//! ([`failed_op_index`] reads it back).

use cube_protocol::{
    BatchOp, Coord, EdgePage, MAX_BATCH_BYTES, MAX_BATCH_OPS, MAX_EDGE_PAGE, MAX_PROGRAM_BYTES,
    MAX_PROGRAM_PAGE, NamespaceName, ProgramPage, Request, Response,
};

use crate::client::Client;
use crate::error::ClientError;

/// What a durable batch answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchAck {
    /// The log sequence number of the batch's first record (0 for an
    /// empty batch); its records are consecutive.
    pub lsn: u64,
    /// Operations applied: all of them.
    pub applied: u32,
}

fn namespace(name: &str) -> Result<NamespaceName, ClientError> {
    NamespaceName::new(name).map_err(|e| ClientError::BadArgument(e.to_string()))
}

fn unexpected(what: &str, response: &Response) -> ClientError {
    ClientError::UnexpectedResponse(format!(
        "{} answer to a {what} request",
        response.opcode().name()
    ))
}

/// The index of the operation an error is about, when its message says
/// (`op N ...`, the convention of the server and of [`Client::batch`]).
pub fn failed_op_index(error: &ClientError) -> Option<usize> {
    let message = match error {
        ClientError::Server(e) => e.message.as_str(),
        ClientError::BadArgument(message) => message.as_str(),
        _ => return None,
    };
    let digits = message.strip_prefix("op ")?;
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

impl Client {
    /// Applies `ops` in namespace `ns` atomically: when this returns `Ok`,
    /// every operation is durable; on any error, none was applied. `ops`
    /// is lent, not consumed (it travels inside the request without a
    /// copy and is handed back, whatever the outcome), so a caller can
    /// drop a refused operation and send the rest again.
    pub fn batch(&mut self, ns: &str, ops: &mut Vec<BatchOp>) -> Result<BatchAck, ClientError> {
        self.check_batch(ops)?;
        let request = Request::Batch {
            ns: namespace(ns)?,
            ops: std::mem::take(ops),
        };
        let outcome = self.call(&request);
        if let Request::Batch { ops: sent, .. } = request {
            *ops = sent;
        }
        match outcome? {
            Response::Batch { lsn, applied } => Ok(BatchAck { lsn, applied }),
            other => Err(unexpected("batch", &other)),
        }
    }

    /// The protocol's and this server's limits on a batch, checked before
    /// sending.
    fn check_batch(&self, ops: &[BatchOp]) -> Result<(), ClientError> {
        if ops.len() > MAX_BATCH_OPS as usize {
            return Err(ClientError::BadArgument(format!(
                "a batch holds at most {MAX_BATCH_OPS} operations, this one {}",
                ops.len()
            )));
        }
        let max_value = self.limits().max_value_bytes as usize;
        let mut bytes = 0u64;
        for (index, op) in ops.iter().enumerate() {
            match op {
                BatchOp::Put { value, .. } if value.len() > max_value => {
                    return Err(ClientError::BadArgument(format!(
                        "op {index} (put): the value is {} bytes, over the server's limit of \
                         {max_value} bytes (max_value_bytes)",
                        value.len()
                    )));
                }
                BatchOp::Prog { source, .. } if source.len() > MAX_PROGRAM_BYTES => {
                    return Err(ClientError::BadArgument(format!(
                        "op {index} (prog): the program is {} bytes, over the limit of \
                         {MAX_PROGRAM_BYTES}",
                        source.len()
                    )));
                }
                _ => {}
            }
            bytes += op.encoded_len() as u64;
        }
        if bytes > MAX_BATCH_BYTES {
            return Err(ClientError::BadArgument(format!(
                "a batch holds at most {MAX_BATCH_BYTES} bytes of operations, this one {bytes}"
            )));
        }
        Ok(())
    }

    /// One page of every edge of `ns`: at most `limit` (capped at
    /// [`MAX_EDGE_PAGE`]; a coordinate's outgoing edges come whole, so
    /// a page may hold a few more), resuming after a previous page's
    /// [`EdgePage::resume_after`].
    pub fn edge_page(
        &mut self,
        ns: &str,
        limit: u32,
        after: Option<u64>,
    ) -> Result<EdgePage, ClientError> {
        let request = Request::EdgeList {
            ns: namespace(ns)?,
            limit: limit.clamp(1, MAX_EDGE_PAGE),
            after,
        };
        match self.call(&request)? {
            Response::EdgeList(page) => Ok(page),
            other => Err(unexpected("edge-list", &other)),
        }
    }

    /// One page of every program of `ns`, in coordinate order (x, then y,
    /// then z), strictly after `after`.
    pub fn program_page(
        &mut self,
        ns: &str,
        limit: u32,
        after: Option<Coord>,
    ) -> Result<ProgramPage, ClientError> {
        let request = Request::ProgramList {
            ns: namespace(ns)?,
            limit: limit.clamp(1, MAX_PROGRAM_PAGE),
            after,
        };
        match self.call(&request)? {
            Response::ProgramList(page) => Ok(page),
            other => Err(unexpected("prog-list", &other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use cube_protocol::{ErrorCode, ServerError};

    use super::*;

    #[test]
    fn op_index_is_read_from_either_side_of_the_socket() {
        let server = ClientError::Server(ServerError::new(
            ErrorCode::ProgramSyntax,
            "op 17 (prog): program at 1,2,3: line 1: unexpected symbol",
        ));
        assert_eq!(failed_op_index(&server), Some(17));
        let local = ClientError::BadArgument("op 0 (put): the value is 9 bytes".to_owned());
        assert_eq!(failed_op_index(&local), Some(0));
        let whole = ClientError::Server(ServerError::new(
            ErrorCode::NoSuchNamespace,
            "no such namespace \"x\"",
        ));
        assert_eq!(failed_op_index(&whole), None);
        let no_number = ClientError::BadArgument("op x".to_owned());
        assert_eq!(failed_op_index(&no_number), None);
    }
}
