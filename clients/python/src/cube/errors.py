"""Exceptions raised by the cube client.

Every error the daemon answers (docs/protocol.md, section 7) becomes a
:class:`ServerError` subclass carrying the protocol's numeric ``code``, its
``name`` and the server's ``message``. Codes this client does not know still
raise :class:`ServerError` (with the code), as the protocol requires.

Failures of the connection itself are :class:`CubeConnectionError`:
:class:`ConnectError` (nothing listens on the socket), :class:`ConnectionLost`
(the daemon went away with a request outstanding: its outcome is unknown) and
:class:`CubeTimeout`. An answer that breaks the protocol is
:class:`ProtocolViolation`.
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class CubeError(Exception):
    """Base class of every exception this package raises on purpose.

    ``cells_written`` is set on one raised by ``write_box`` or
    ``write_cells``: how many cells were stored before it (whole batches,
    each acknowledged); None elsewhere."""

    cells_written: Optional[int] = None


class CubeConnectionError(CubeError):
    """The connection to cubed could not be made or was lost."""


class ConnectError(CubeConnectionError):
    """Connecting to the daemon's socket failed (is cubed running?)."""


class ConnectionLost(CubeConnectionError):
    """The daemon closed the connection or it broke.

    Requests that were outstanding may or may not have been carried out
    (docs/protocol.md, section 8.2). The next call reconnects when the
    client was made with ``reconnect=True`` (the default).
    """


class CubeTimeout(CubeConnectionError, TimeoutError):
    """No answer within the client's timeout. The connection is dropped,
    since a late answer could otherwise be taken for the next request's."""


class ProtocolViolation(CubeError):
    """The daemon sent something docs/protocol.md does not allow (a bad
    checksum, a malformed body, an answer to another request)."""


class ServerError(CubeError):
    """An error response from cubed: ``code`` (the protocol's number),
    ``name`` (e.g. ``"no_such_namespace"``) and ``message`` (for people; do
    not parse it). The request was not carried out (docs/protocol.md 6.5)."""

    code: int = 0
    name: str = "unknown"

    def __init__(self, code: int, message: str, opcode: Optional[int] = None) -> None:
        super().__init__(f"{error_name(code)} ({code}): {message}")
        self.code = code
        self.name = error_name(code)
        self.message = message
        self.opcode = opcode


class MalformedFrame(ServerError):
    """1: the request body did not decode."""


class BadChecksum(ServerError):
    """2: the request body's CRC32C did not match."""


class FrameTooLarge(ServerError):
    """3: the frame was over the server's max_frame_bytes (connection closed)."""


class UnknownOpcode(ServerError):
    """4: the server does not know the opcode."""


class VersionMismatch(ServerError):
    """5: the server does not speak this protocol version."""


class ValueTooLarge(ServerError):
    """6: a value over max_value_bytes."""


class BadNamespace(ServerError):
    """7: the namespace name breaks the rules (1-64 of [a-z0-9_-])."""


class NoSuchNamespace(ServerError):
    """8: no such namespace (or this uid may not see it)."""


class WritesDisabled(ServerError):
    """9: an earlier storage failure latched the writer; restart cubed."""


class ShuttingDown(ServerError):
    """10: the daemon is shutting down; the request was not carried out."""


class TooManyConnections(ServerError):
    """11: the daemon's connection cap is reached."""


class Internal(ServerError):
    """12: a bug inside the daemon."""


class StorageIO(ServerError):
    """13: writing or syncing the log failed; the write is not acknowledged."""


class DiskFull(ServerError):
    """14: the disk is full; the write was not stored."""


class BadRequest(ServerError):
    """15: not allowed now (a request before hello, or hello twice)."""


class Overloaded(ServerError):
    """16: the daemon is too busy; not carried out, may be retried."""


class InvalidArgument(ServerError):
    """17: a field's value is not allowed (the message names it)."""


class LimitExceeded(ServerError):
    """18: more than a server limit allows (the message names it)."""


class BadWeight(ServerError):
    """19: an edge weight that is NaN, infinite or negative."""


class ProgramSyntax(ServerError):
    """20: a program source does not compile (message starts ``line N:``)."""


class ProgramFailed(ServerError):
    """Base of 21-23: a run failed; nothing it wrote was applied."""


class ProgramError(ProgramFailed):
    """21: the program raised an error."""


class ProgramFuel(ProgramFailed):
    """22: the program used up its instruction budget."""


class ProgramMemory(ProgramFailed):
    """23: the program used up its memory budget."""


class NamespaceExists(ServerError):
    """24: ns_create of a name in use."""


class QuotaExceeded(ServerError):
    """25: a write past a namespace quota; nothing was applied."""


class PermissionDenied(ServerError):
    """26: this uid may see the namespace but not do this."""


class EncryptionUnavailable(ServerError):
    """27: encrypted namespace asked for, but cubed has no --key-file."""


class BadPath(ServerError):
    """28: a backup destination that cannot be used (the message says why)."""


#: Code -> (name, exception class), as in docs/protocol.md section 7.
ERROR_CODES: Dict[int, "tuple[str, Type[ServerError]]"] = {
    1: ("malformed_frame", MalformedFrame),
    2: ("bad_checksum", BadChecksum),
    3: ("frame_too_large", FrameTooLarge),
    4: ("unknown_opcode", UnknownOpcode),
    5: ("version_mismatch", VersionMismatch),
    6: ("value_too_large", ValueTooLarge),
    7: ("bad_namespace", BadNamespace),
    8: ("no_such_namespace", NoSuchNamespace),
    9: ("writes_disabled", WritesDisabled),
    10: ("shutting_down", ShuttingDown),
    11: ("too_many_connections", TooManyConnections),
    12: ("internal", Internal),
    13: ("storage_io", StorageIO),
    14: ("disk_full", DiskFull),
    15: ("bad_request", BadRequest),
    16: ("overloaded", Overloaded),
    17: ("invalid_argument", InvalidArgument),
    18: ("limit_exceeded", LimitExceeded),
    19: ("bad_weight", BadWeight),
    20: ("program_syntax", ProgramSyntax),
    21: ("program_error", ProgramError),
    22: ("program_fuel", ProgramFuel),
    23: ("program_memory", ProgramMemory),
    24: ("namespace_exists", NamespaceExists),
    25: ("quota_exceeded", QuotaExceeded),
    26: ("permission_denied", PermissionDenied),
    27: ("encryption_unavailable", EncryptionUnavailable),
    28: ("bad_path", BadPath),
}


def error_name(code: int) -> str:
    """The protocol's name of an error code, ``"unknown"`` if it has none."""
    entry = ERROR_CODES.get(code)
    return entry[0] if entry else "unknown"


def server_error(code: int, message: str, opcode: Optional[int] = None) -> ServerError:
    """The exception for an error response with this code."""
    entry = ERROR_CODES.get(code)
    cls = entry[1] if entry else ServerError
    return cls(code, message, opcode)
