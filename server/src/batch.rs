//! `batch` (opcode 0x0014): many writes of one namespace applied as one
//! atomic unit, which is what `cubec import` sends; and, through
//! [`crate::listing`], the `edge-list` and `prog-list` pages that
//! `cubec export` reads.
//!
//! A batch is checked whole before the writer sees it: the limits (ops,
//! bytes), every edge weight, and every program's syntax (compiled like
//! `prog` does). Then one writer transaction re-checks what only the
//! writer can (the namespace, `--max-edges-per-cell` against the latest
//! state and the batch's own earlier links) and emits every mutation. A
//! transaction's mutations commit in one WAL commit group, and recovery
//! applies a group whole or not at all, so a batch is never half-applied,
//! even across `kill -9`; it is acknowledged only once the group is
//! durable (the writer's fdatasync).
//!
//! An error about one operation starts its message with `op N` (N counting
//! from 0 in the batch), which `cubec import` turns back into a line number.

use cube_protocol::{
    BatchOp, EdgeWeight, ErrorCode, MAX_BATCH_BYTES, MAX_BATCH_OPS, NamespaceName, Request,
    Response, ServerError,
};
use cube_store::{EdgeKey, MAX_TXN_MUTATIONS, Mutation, WriteSession};

use crate::connection::{no_such_namespace, write_error};
use crate::edges::edge_cap_reached;
use crate::server::Shared;

// A batch must fit in one writer transaction, or it could not be atomic.
const _: () = assert!(MAX_BATCH_OPS as usize <= MAX_TXN_MUTATIONS);

/// Serves `batch`, and hands `edge-list` and `prog-list` to
/// [`crate::listing`].
pub(crate) fn handle(
    shared: &Shared,
    session: Option<&WriteSession>,
    request: Request,
) -> Result<Response, ServerError> {
    match request {
        Request::Batch { ns, ops } => apply(shared, session, ns, ops),
        list @ (Request::EdgeList { .. } | Request::ProgramList { .. }) => {
            crate::listing::handle(shared, list)
        }
        other => Err(ServerError::new(
            ErrorCode::Internal,
            format!("{} reached the batch handler", other.opcode().name()),
        )),
    }
}

/// The error about operation `index`, with the promise that nothing of the
/// batch was applied (checks run before anything is written).
fn op_error(code: ErrorCode, index: usize, op: &'static str, why: &str) -> ServerError {
    ServerError::new(
        code,
        format!("op {index} ({op}): {why}; nothing of the batch was applied"),
    )
}

/// Checks the batch's limits and every operation that can be checked
/// without the writer, and turns the operations into mutations.
fn check(ns: &NamespaceName, ops: Vec<BatchOp>) -> Result<Vec<Mutation>, ServerError> {
    check_limits(&ops)?;
    ops.into_iter()
        .enumerate()
        .map(|(index, op)| to_mutation(ns, index, op))
        .collect()
}

/// The batch's limits: how many operations, and their bytes.
fn check_limits(ops: &[BatchOp]) -> Result<(), ServerError> {
    if ops.len() > MAX_BATCH_OPS as usize {
        return Err(ServerError::new(
            ErrorCode::LimitExceeded,
            format!(
                "a batch holds at most {MAX_BATCH_OPS} operations, this one {}; \
                 nothing was applied: send smaller batches (cubec import --batch)",
                ops.len()
            ),
        ));
    }
    let bytes: u64 = ops.iter().map(|op| op.encoded_len() as u64).sum();
    if bytes > MAX_BATCH_BYTES {
        return Err(ServerError::new(
            ErrorCode::LimitExceeded,
            format!(
                "a batch holds at most {MAX_BATCH_BYTES} bytes of operations, this one \
                 {bytes}; nothing was applied: send smaller batches (cubec import --batch)"
            ),
        ));
    }
    Ok(())
}

/// Operation `index` of a batch in `ns` as its mutation, once what can be
/// checked without the writer (a weight, a program's syntax) is.
fn to_mutation(ns: &NamespaceName, index: usize, op: BatchOp) -> Result<Mutation, ServerError> {
    let name = op.name();
    let mutation = match op {
        BatchOp::Put { coord, value } => Mutation::Put {
            ns: ns.clone(),
            coord,
            value,
        },
        BatchOp::Link {
            from,
            to,
            label,
            weight,
        } => {
            let weight = EdgeWeight::new(weight)
                .map_err(|why| op_error(ErrorCode::BadWeight, index, name, &why))?;
            Mutation::Link {
                ns: ns.clone(),
                edge: EdgeKey::new(from, to, label),
                weight,
            }
        }
        BatchOp::Prog { coord, source } if source.is_empty() => Mutation::ProgramDel {
            ns: ns.clone(),
            coord,
        },
        BatchOp::Prog { coord, source } => {
            crate::programs::sandbox::check_syntax(&source).map_err(|e| {
                let at = e
                    .line
                    .map_or(String::new(), |line| format!("line {line}: "));
                op_error(
                    ErrorCode::ProgramSyntax,
                    index,
                    name,
                    &format!("program at {coord}: {at}{}", e.message),
                )
            })?;
            Mutation::ProgramPut {
                ns: ns.clone(),
                coord,
                source,
            }
        }
    };
    Ok(mutation)
}

fn apply(
    shared: &Shared,
    session: Option<&WriteSession>,
    ns: NamespaceName,
    ops: Vec<BatchOp>,
) -> Result<Response, ServerError> {
    if !shared.engine.memstore().has_namespace(&ns) {
        return Err(no_such_namespace(&ns));
    }
    let mutations = check(&ns, ops)?;
    let applied = mutations.len();
    let session = session.ok_or_else(|| {
        ServerError::new(
            ErrorCode::ShuttingDown,
            "cubed is shutting down; nothing of the batch was applied",
        )
    })?;
    let max_edges = shared.args.max_edges_per_cell as usize;
    let (outcome, lsn) = session
        .transact(move |view| {
            if !view.has_namespace(&ns) {
                return Err(no_such_namespace(&ns));
            }
            for (index, mutation) in mutations.into_iter().enumerate() {
                if let Mutation::Link { edge, .. } = &mutation
                    && !view.has_edge(&ns, edge)
                    && let Some(full) = edge_cap_reached(view, &ns, edge, max_edges)
                {
                    view.rollback();
                    return Err(op_error(ErrorCode::LimitExceeded, index, "link", &full));
                }
                view.emit(mutation);
            }
            Ok(())
        })
        .map_err(|e| write_error(&e))?;
    outcome?;
    Ok(Response::Batch {
        lsn,
        // At most MAX_BATCH_OPS.
        applied: u32::try_from(applied).unwrap_or(u32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use cube_protocol::{Coord, EdgeLabel};

    use super::*;

    fn ns() -> NamespaceName {
        NamespaceName::new("default").unwrap()
    }

    #[test]
    fn limits_and_bad_operations_are_refused_with_their_index() {
        let too_many = vec![
            BatchOp::Put {
                coord: Coord::new(0, 0, 0),
                value: Vec::new(),
            };
            MAX_BATCH_OPS as usize + 1
        ];
        let err = check(&ns(), too_many).unwrap_err();
        assert_eq!(err.known_code(), Some(ErrorCode::LimitExceeded));
        let too_big = vec![
            BatchOp::Put {
                coord: Coord::new(0, 0, 0),
                value: vec![0; 1024 * 1024],
            };
            9
        ];
        let err = check(&ns(), too_big).unwrap_err();
        assert_eq!(err.known_code(), Some(ErrorCode::LimitExceeded));
        assert!(err.message.contains("bytes"), "{}", err.message);

        let put = BatchOp::Put {
            coord: Coord::new(1, 2, 3),
            value: b"v".to_vec(),
        };
        let bad_weight = BatchOp::Link {
            from: Coord::new(0, 0, 0),
            to: Coord::new(1, 0, 0),
            label: EdgeLabel::default(),
            weight: -1.0,
        };
        let err = check(&ns(), vec![put.clone(), bad_weight]).unwrap_err();
        assert_eq!(err.known_code(), Some(ErrorCode::BadWeight));
        assert!(err.message.starts_with("op 1 (link): "), "{}", err.message);

        let bad_program = BatchOp::Prog {
            coord: Coord::new(0, 0, 0),
            source: b"return (".to_vec(),
        };
        let err = check(&ns(), vec![put.clone(), put.clone(), bad_program]).unwrap_err();
        assert_eq!(err.known_code(), Some(ErrorCode::ProgramSyntax));
        assert!(err.message.starts_with("op 2 (prog): "), "{}", err.message);

        let good = vec![
            put,
            BatchOp::Prog {
                coord: Coord::new(0, 0, 0),
                source: b"return 1".to_vec(),
            },
            BatchOp::Prog {
                coord: Coord::new(0, 0, 0),
                source: Vec::new(),
            },
        ];
        let mutations = check(&ns(), good).unwrap();
        assert!(matches!(mutations[2], Mutation::ProgramDel { .. }));
    }
}
