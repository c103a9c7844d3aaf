//! Protocol errors: what can go wrong decoding bytes, and the stable numeric
//! codes the server sends back.

use thiserror::Error;

/// Why a frame body could not be decoded. Every variant leaves the
/// connection's framing intact: the server answers with an error and keeps
/// reading.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("body truncated: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("{trailing} unexpected bytes after the end of the message")]
    TrailingBytes { trailing: usize },
    #[error("unknown opcode 0x{0:04x}")]
    UnknownOpcode(u16),
    /// A length in bytes over its limit.
    #[error("{what} is {got} bytes, over the limit of {limit}")]
    TooLarge {
        what: &'static str,
        got: u64,
        limit: u64,
    },
    /// A count of items (cells, entries, arguments) over its limit.
    #[error("{what} is {got}, over the limit of {limit}")]
    TooMany {
        what: &'static str,
        got: u64,
        limit: u64,
    },
    #[error("bad namespace: {0}")]
    BadNamespace(String),
    #[error("{0} is not valid UTF-8")]
    BadUtf8(&'static str),
    #[error("bad value for {what}: {got}")]
    BadField { what: &'static str, got: u64 },
}

/// A frame-level failure: either the connection's framing is lost (the
/// connection must be closed) or one frame is bad (answer and carry on).
#[derive(Debug, Error)]
pub enum ProtocolError {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection closed")]
    Closed,
    #[error("connection closed in the middle of a frame ({got} of {expected} bytes)")]
    TruncatedFrame { got: usize, expected: usize },
    #[error("frame of {got} bytes is over the limit of {limit} bytes")]
    FrameTooLarge { got: u64, limit: u64 },
    #[error("body checksum mismatch: header says {expected:08x}, body has {actual:08x}")]
    BadChecksum { expected: u32, actual: u32 },
    #[error("protocol version {got} is not supported (this side speaks {supported})")]
    VersionMismatch { got: u16, supported: u16 },
    #[error("malformed message: {0}")]
    Decode(#[from] DecodeError),
}

impl ProtocolError {
    /// The wire code the server reports for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::Io(_) | ProtocolError::Closed | ProtocolError::TruncatedFrame { .. } => {
                ErrorCode::MalformedFrame
            }
            ProtocolError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            ProtocolError::BadChecksum { .. } => ErrorCode::BadChecksum,
            ProtocolError::VersionMismatch { .. } => ErrorCode::VersionMismatch,
            ProtocolError::Decode(e) => e.code(),
        }
    }
}

impl DecodeError {
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::UnknownOpcode(_) => ErrorCode::UnknownOpcode,
            DecodeError::TooLarge { what, .. } if *what == "value" => ErrorCode::ValueTooLarge,
            DecodeError::BadNamespace(_) => ErrorCode::BadNamespace,
            DecodeError::TooMany { what, .. } if *what == crate::bulk::BATCH_OPERATIONS => {
                ErrorCode::LimitExceeded
            }
            _ => ErrorCode::MalformedFrame,
        }
    }
}

/// Stable numeric error codes carried in error responses. Numbers never
/// change meaning; new codes are only ever appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The body did not decode as the message its opcode names.
    MalformedFrame = 1,
    /// The body's CRC32C does not match the header.
    BadChecksum = 2,
    /// The frame is larger than the server accepts.
    FrameTooLarge = 3,
    /// The opcode is not one this server knows.
    UnknownOpcode = 4,
    /// The frame's protocol version is not supported.
    VersionMismatch = 5,
    /// A value is larger than the server's value limit.
    ValueTooLarge = 6,
    /// A namespace name breaks the naming rules.
    BadNamespace = 7,
    /// The namespace does not exist.
    NoSuchNamespace = 8,
    /// An earlier storage failure latched the writer; writes are refused until restart.
    WritesDisabled = 9,
    /// The server is shutting down and takes no new requests.
    ShuttingDown = 10,
    /// The connection cap is reached.
    TooManyConnections = 11,
    /// A bug or unexpected condition inside the server.
    Internal = 12,
    /// Writing or syncing the log failed for this request, or reading
    /// the cells it needs did (a namespace on disk: a damaged block or an
    /// I/O error, named with its file and offset).
    StorageIo = 13,
    /// The disk is full; this write was not stored.
    DiskFull = 14,
    /// The request is valid but not allowed in this state (e.g. hello twice).
    BadRequest = 15,
    /// The server is too busy to queue this request.
    Overloaded = 16,
    /// A field decoded fine but its value is not allowed (e.g. a scan box
    /// whose low corner is above its high corner, or a page limit of 0).
    InvalidArgument = 17,
    /// A request asks for more than a server limit allows (walk depth or
    /// nodes, edges per coordinate, work per walk or path); the message
    /// names the limit and its flag.
    LimitExceeded = 18,
    /// An edge weight that is NaN, infinite or negative.
    BadWeight = 19,
    /// `prog`: the source does not compile; the message gives the line
    /// and Lua's reason. Nothing was stored.
    ProgramSyntax = 20,
    /// `run`: the program failed (its own error, a bad API call, a result
    /// that cannot be returned). Nothing it wrote was applied; the failure
    /// is recorded in the cell's telemetry.
    ProgramError = 21,
    /// `run`: the program used up its instruction budget
    /// (`--program-fuel`). Nothing it wrote was applied; recorded.
    ProgramFuel = 22,
    /// `run`: the program used up its memory budget (`--program-memory`).
    /// Nothing it wrote was applied; recorded.
    ProgramMemory = 23,
    /// `ns-create`: a namespace of that name already exists.
    NamespaceExists = 24,
    /// A write would take the namespace past a quota; the message names
    /// the quota, its limit and its use; nothing was applied.
    QuotaExceeded = 25,
    /// The connection's uid may see the namespace but not do this (a
    /// read-only grant writing, or a non-owner administering).
    PermissionDenied = 26,
    /// An encrypted namespace was asked for but the daemon has no
    /// `--key-file`.
    EncryptionUnavailable = 27,
    /// A path in the request cannot be used: a `backup` destination with a
    /// NUL byte, a name or path too long, `..`, or inside the live data
    /// dir. Nothing was written.
    BadPath = 28,
}

impl ErrorCode {
    pub fn from_u16(code: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match code {
            1 => MalformedFrame,
            2 => BadChecksum,
            3 => FrameTooLarge,
            4 => UnknownOpcode,
            5 => VersionMismatch,
            6 => ValueTooLarge,
            7 => BadNamespace,
            8 => NoSuchNamespace,
            9 => WritesDisabled,
            10 => ShuttingDown,
            11 => TooManyConnections,
            12 => Internal,
            13 => StorageIo,
            14 => DiskFull,
            15 => BadRequest,
            16 => Overloaded,
            17 => InvalidArgument,
            18 => LimitExceeded,
            19 => BadWeight,
            20 => ProgramSyntax,
            21 => ProgramError,
            22 => ProgramFuel,
            23 => ProgramMemory,
            24 => NamespaceExists,
            25 => QuotaExceeded,
            26 => PermissionDenied,
            27 => EncryptionUnavailable,
            28 => BadPath,
            _ => return None,
        })
    }

    /// A short, stable, lowercase name for logs and `--json` output.
    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            MalformedFrame => "malformed_frame",
            BadChecksum => "bad_checksum",
            FrameTooLarge => "frame_too_large",
            UnknownOpcode => "unknown_opcode",
            VersionMismatch => "version_mismatch",
            ValueTooLarge => "value_too_large",
            BadNamespace => "bad_namespace",
            NoSuchNamespace => "no_such_namespace",
            WritesDisabled => "writes_disabled",
            ShuttingDown => "shutting_down",
            TooManyConnections => "too_many_connections",
            Internal => "internal",
            StorageIo => "storage_io",
            DiskFull => "disk_full",
            BadRequest => "bad_request",
            Overloaded => "overloaded",
            InvalidArgument => "invalid_argument",
            LimitExceeded => "limit_exceeded",
            BadWeight => "bad_weight",
            ProgramSyntax => "program_syntax",
            ProgramError => "program_error",
            ProgramFuel => "program_fuel",
            ProgramMemory => "program_memory",
            NamespaceExists => "namespace_exists",
            QuotaExceeded => "quota_exceeded",
            PermissionDenied => "permission_denied",
            EncryptionUnavailable => "encryption_unavailable",
            BadPath => "bad_path",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for n in 0..100u16 {
            if let Some(code) = ErrorCode::from_u16(n) {
                assert_eq!(code as u16, n);
                assert!(!code.name().is_empty());
            }
        }
        assert_eq!(ErrorCode::from_u16(16), Some(ErrorCode::Overloaded));
        assert_eq!(ErrorCode::from_u16(17), Some(ErrorCode::InvalidArgument));
        assert_eq!(ErrorCode::from_u16(19), Some(ErrorCode::BadWeight));
        assert_eq!(ErrorCode::from_u16(23), Some(ErrorCode::ProgramMemory));
        assert_eq!(ErrorCode::from_u16(24), Some(ErrorCode::NamespaceExists));
        assert_eq!(ErrorCode::from_u16(25), Some(ErrorCode::QuotaExceeded));
        assert_eq!(ErrorCode::from_u16(26), Some(ErrorCode::PermissionDenied));
        assert_eq!(
            ErrorCode::EncryptionUnavailable.name(),
            "encryption_unavailable"
        );
        assert_eq!(ErrorCode::from_u16(28), Some(ErrorCode::BadPath));
        assert_eq!(ErrorCode::from_u16(29), None);
    }
}
