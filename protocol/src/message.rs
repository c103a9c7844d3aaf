//! Requests and responses and their body encodings.
//!
//! A response body starts with a status byte: `0` then the result fields of
//! the request's opcode, or `1` then an error (`u16` code, `u16` length,
//! UTF-8 message).

use crate::error::{DecodeError, ErrorCode};
use crate::frame::{FrameHeader, Limits, Opcode, RESPONSE_BIT, encode_frame};
use crate::model::{Coord, NamespaceName};
use crate::wire::{
    BodyReader, put_blob, put_coord, put_namespace, put_short_string, put_u16, put_u32, put_u64,
};

/// Longest client name, server version or stats name accepted.
const MAX_NAME_BYTES: usize = 256;
/// Longest error message or stats text accepted.
const MAX_MESSAGE_BYTES: usize = 4096;
/// Most entries in one stats response.
pub const MAX_STATS_ENTRIES: usize = 4096;

const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;

#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Hello {
        client_version: u16,
        client_name: String,
    },
    Ping,
    Stats,
    Put {
        ns: NamespaceName,
        coord: Coord,
        value: Vec<u8>,
    },
    Get {
        ns: NamespaceName,
        coord: Coord,
    },
    Del {
        ns: NamespaceName,
        coord: Coord,
    },
}

impl Request {
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello { .. } => Opcode::Hello,
            Request::Ping => Opcode::Ping,
            Request::Stats => Opcode::Stats,
            Request::Put { .. } => Opcode::Put,
            Request::Get { .. } => Opcode::Get,
            Request::Del { .. } => Opcode::Del,
        }
    }

    /// Appends the whole frame for this request to `out`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        encode_frame(out, self.opcode() as u16, request_id, |b| match self {
            Request::Hello {
                client_version,
                client_name,
            } => {
                put_u16(b, *client_version);
                put_short_string(b, client_name, MAX_NAME_BYTES);
            }
            Request::Ping | Request::Stats => {}
            Request::Put { ns, coord, value } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
                put_blob(b, value);
            }
            Request::Get { ns, coord } | Request::Del { ns, coord } => {
                put_namespace(b, ns);
                put_coord(b, *coord);
            }
        });
    }

    /// Decodes a verified frame body. Never panics; allocates at most the
    /// body's length.
    pub fn decode(
        header: &FrameHeader,
        body: &[u8],
        limits: &Limits,
    ) -> Result<Request, DecodeError> {
        let opcode =
            Opcode::from_u16(header.opcode).ok_or(DecodeError::UnknownOpcode(header.opcode))?;
        let mut r = BodyReader::new(body);
        let request = match opcode {
            Opcode::Hello => Request::Hello {
                client_version: r.u16()?,
                client_name: r.short_string("client name", MAX_NAME_BYTES)?,
            },
            Opcode::Ping => Request::Ping,
            Opcode::Stats => Request::Stats,
            Opcode::Put => Request::Put {
                ns: r.namespace()?,
                coord: r.coord()?,
                value: r.blob("value", limits.max_value_bytes as usize)?,
            },
            Opcode::Get => Request::Get {
                ns: r.namespace()?,
                coord: r.coord()?,
            },
            Opcode::Del => Request::Del {
                ns: r.namespace()?,
                coord: r.coord()?,
            },
        };
        r.finish()?;
        Ok(request)
    }
}

/// One named figure in a stats response.
#[derive(Clone, Debug, PartialEq)]
pub enum StatsValue {
    Count(u64),
    Float(f64),
    Text(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct StatsEntry {
    pub name: String,
    pub value: StatsValue,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Hello {
        protocol_version: u16,
        server_version: String,
        max_frame_bytes: u32,
        max_value_bytes: u32,
    },
    Pong,
    Stats(Vec<StatsEntry>),
    /// The write is durable (or, under a relaxed sync mode, logged) at `lsn`.
    Put {
        lsn: u64,
    },
    Get(Option<Vec<u8>>),
    Del {
        lsn: u64,
        existed: bool,
    },
}

/// An error response: a stable code and a human message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    /// The raw code, kept even when this build does not know it.
    pub code: u16,
    pub message: String,
}

impl ServerError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ServerError {
        ServerError {
            code: code as u16,
            message: message.into(),
        }
    }

    pub fn known_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_u16(self.code)
    }
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.known_code().map_or("unknown_error", ErrorCode::name);
        write!(f, "{} ({name}, code {})", self.message, self.code)
    }
}

impl std::error::Error for ServerError {}

impl Response {
    pub fn opcode(&self) -> Opcode {
        match self {
            Response::Hello { .. } => Opcode::Hello,
            Response::Pong => Opcode::Ping,
            Response::Stats(_) => Opcode::Stats,
            Response::Put { .. } => Opcode::Put,
            Response::Get(_) => Opcode::Get,
            Response::Del { .. } => Opcode::Del,
        }
    }

    /// Appends a success frame answering `request_id`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        encode_frame(out, self.opcode() as u16 | RESPONSE_BIT, request_id, |b| {
            b.push(STATUS_OK);
            match self {
                Response::Hello {
                    protocol_version,
                    server_version,
                    max_frame_bytes,
                    max_value_bytes,
                } => {
                    put_u16(b, *protocol_version);
                    put_short_string(b, server_version, MAX_NAME_BYTES);
                    put_u32(b, *max_frame_bytes);
                    put_u32(b, *max_value_bytes);
                }
                Response::Pong => {}
                Response::Stats(entries) => {
                    let entries = &entries[..entries.len().min(MAX_STATS_ENTRIES)];
                    put_u16(b, entries.len() as u16);
                    for entry in entries {
                        put_short_string(b, &entry.name, MAX_NAME_BYTES);
                        match &entry.value {
                            StatsValue::Count(v) => {
                                b.push(0);
                                put_u64(b, *v);
                            }
                            StatsValue::Float(v) => {
                                b.push(1);
                                put_u64(b, v.to_bits());
                            }
                            StatsValue::Text(t) => {
                                b.push(2);
                                put_short_string(b, t, MAX_MESSAGE_BYTES);
                            }
                        }
                    }
                }
                Response::Put { lsn } => put_u64(b, *lsn),
                Response::Get(value) => match value {
                    None => b.push(0),
                    Some(v) => {
                        b.push(1);
                        put_blob(b, v);
                    }
                },
                Response::Del { lsn, existed } => {
                    put_u64(b, *lsn);
                    b.push(u8::from(*existed));
                }
            }
        });
    }

    /// Appends an error frame. `opcode` is the raw request opcode (0 when
    /// the request could not be read at all).
    pub fn encode_error(opcode: u16, request_id: u64, error: &ServerError, out: &mut Vec<u8>) {
        encode_frame(
            out,
            (opcode & !RESPONSE_BIT) | RESPONSE_BIT,
            request_id,
            |b| {
                b.push(STATUS_ERROR);
                put_u16(b, error.code);
                put_short_string(b, &error.message, MAX_MESSAGE_BYTES);
            },
        );
    }

    /// Decodes a verified response body: the outer `Result` is about bytes,
    /// the inner one is what the server said.
    pub fn decode(
        header: &FrameHeader,
        body: &[u8],
        limits: &Limits,
    ) -> Result<Result<Response, ServerError>, DecodeError> {
        let mut r = BodyReader::new(body);
        let status = r.u8()?;
        if status == STATUS_ERROR {
            let code = r.u16()?;
            let message = r.short_string("error message", MAX_MESSAGE_BYTES)?;
            r.finish()?;
            return Ok(Err(ServerError { code, message }));
        }
        if status != STATUS_OK {
            return Err(DecodeError::BadField {
                what: "response status",
                got: u64::from(status),
            });
        }
        let raw = header.opcode & !RESPONSE_BIT;
        if header.opcode & RESPONSE_BIT == 0 {
            return Err(DecodeError::BadField {
                what: "response opcode without the response bit",
                got: u64::from(header.opcode),
            });
        }
        let opcode = Opcode::from_u16(raw).ok_or(DecodeError::UnknownOpcode(raw))?;
        let response = match opcode {
            Opcode::Hello => Response::Hello {
                protocol_version: r.u16()?,
                server_version: r.short_string("server version", MAX_NAME_BYTES)?,
                max_frame_bytes: r.u32()?,
                max_value_bytes: r.u32()?,
            },
            Opcode::Ping => Response::Pong,
            Opcode::Stats => {
                let count = usize::from(r.u16()?);
                if count > MAX_STATS_ENTRIES {
                    return Err(DecodeError::TooLarge {
                        what: "stats entry count",
                        got: count as u64,
                        limit: MAX_STATS_ENTRIES as u64,
                    });
                }
                // Each entry is at least 3 bytes; never reserve more than the
                // body could hold.
                let mut entries = Vec::with_capacity(count.min(r.remaining() / 3));
                for _ in 0..count {
                    let name = r.short_string("stats name", MAX_NAME_BYTES)?;
                    let value = match r.u8()? {
                        0 => StatsValue::Count(r.u64()?),
                        1 => StatsValue::Float(f64::from_bits(r.u64()?)),
                        2 => StatsValue::Text(r.short_string("stats text", MAX_MESSAGE_BYTES)?),
                        other => {
                            return Err(DecodeError::BadField {
                                what: "stats value tag",
                                got: u64::from(other),
                            });
                        }
                    };
                    entries.push(StatsEntry { name, value });
                }
                Response::Stats(entries)
            }
            Opcode::Put => Response::Put { lsn: r.u64()? },
            Opcode::Get => {
                if r.bool()? {
                    Response::Get(Some(r.blob("value", limits.max_value_bytes as usize)?))
                } else {
                    Response::Get(None)
                }
            }
            Opcode::Del => Response::Del {
                lsn: r.u64()?,
                existed: r.bool()?,
            },
        };
        r.finish()?;
        Ok(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HEADER_BYTES;

    fn split(frame: &[u8]) -> (FrameHeader, &[u8]) {
        let header = FrameHeader::parse(frame[..HEADER_BYTES].try_into().unwrap());
        header.verify_body(&frame[HEADER_BYTES..]).unwrap();
        (header, &frame[HEADER_BYTES..])
    }

    #[test]
    fn put_request_round_trips() {
        let req = Request::Put {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(1, -2, 3),
            value: b"hello".to_vec(),
        };
        let mut out = Vec::new();
        req.encode(42, &mut out);
        let (header, body) = split(&out);
        assert_eq!(header.request_id, 42);
        assert_eq!(
            Request::decode(&header, body, &Limits::default()).unwrap(),
            req
        );
    }

    #[test]
    fn value_over_the_limit_is_value_too_large() {
        let req = Request::Put {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(0, 0, 0),
            value: vec![7; 100],
        };
        let mut out = Vec::new();
        req.encode(1, &mut out);
        let (header, body) = split(&out);
        let limits = Limits {
            max_value_bytes: 99,
            ..Limits::default()
        };
        let err = Request::decode(&header, body, &limits).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ValueTooLarge);
    }

    #[test]
    fn error_response_round_trips() {
        let mut out = Vec::new();
        let e = ServerError::new(ErrorCode::NoSuchNamespace, "no namespace \"x\"");
        Response::encode_error(Opcode::Get as u16, 9, &e, &mut out);
        let (header, body) = split(&out);
        assert_eq!(header.opcode, Opcode::Get as u16 | RESPONSE_BIT);
        assert_eq!(
            Response::decode(&header, body, &Limits::default()).unwrap(),
            Err(e)
        );
    }
}
