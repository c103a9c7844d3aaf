//! `--metrics-listen ADDR`: the stats as Prometheus scrapes them, over HTTP
//! (`GET /metrics`), on a thread of its own.
//!
//! The responder is std's `TcpListener` and a few lines of HTTP/1.x, not a
//! server crate: one route, one request per connection (`Connection:
//! close`), a bounded request head and short timeouts are all a scraper
//! needs, and tiny_http would bring five crates and its own threads for
//! that. The exposition itself is written by `cube_metrics` (the
//! `prometheus` crate), the same text `cubec stats --prometheus` prints.
//!
//! Off by default. Anyone who can connect sees every namespace's name and
//! size, so it listens on loopback only unless `--metrics-listen-any`.

use log::warn;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::access::Peer;
use crate::server::{DaemonError, Shared};

/// Most bytes of a request head (request line and headers) read.
const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;
/// A scraper that sends or reads this slowly is dropped, so one slow
/// client holds the (single) metrics thread at most this long.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Refuses a non-loopback `addr` unless `any` (`--metrics-listen-any`).
pub(crate) fn check_address(addr: SocketAddr, any: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || any {
        Ok(())
    } else {
        Err(format!(
            "--metrics-listen {addr} is not a loopback address: every host that reaches it \
             would see all namespaces' names and sizes; use 127.0.0.1:PORT (or [::1]:PORT), \
             or add --metrics-listen-any to serve it anyway"
        ))
    }
}

/// Binds `addr` and serves `/metrics` from a new thread until the process
/// ends. A bind failure stops cubed from starting (asked for, not served).
pub(crate) fn start(addr: SocketAddr, shared: Arc<Shared>) -> Result<SocketAddr, DaemonError> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        DaemonError::Io(io::Error::new(
            e.kind(),
            format!("cannot listen for metrics on {addr} (--metrics-listen): {e}"),
        ))
    })?;
    let bound = listener.local_addr().map_err(DaemonError::Io)?;
    thread::Builder::new()
        .name("metrics-http".to_owned())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => serve(stream, &shared),
                    Err(e) => warn!("metrics: accept failed: {e}"),
                }
            }
        })
        .map_err(DaemonError::Io)?;
    Ok(bound)
}

/// Answers one request; errors only mean the scraper went away.
fn serve(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let answer = match read_request_line(&mut stream) {
        Ok(line) => answer(&line, shared),
        Err(_) => return,
    };
    let _ = stream.write_all(&answer);
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// The request line, once the whole head (up to the blank line) is in.
fn read_request_line(stream: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= MAX_REQUEST_HEAD_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    Ok(String::from_utf8_lossy(line).into_owned())
}

fn answer(request_line: &str, shared: &Shared) -> Vec<u8> {
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => match cube_metrics::exposition(&entries(shared)) {
            Ok(text) => response("200 OK", cube_metrics::CONTENT_TYPE, &text),
            Err(why) => response("500 Internal Server Error", "text/plain", &why),
        },
        ("GET", _) => response(
            "404 Not Found",
            "text/plain",
            "cubed serves its metrics at /metrics\n",
        ),
        _ => response(
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics is served\n",
        ),
    }
}

/// What an administrator's `stats` shows: the whole store, every namespace.
fn entries(shared: &Shared) -> Vec<cube_protocol::StatsEntry> {
    let mut entries = shared.stats_entries();
    let own = nix::unistd::getuid().as_raw();
    let admin = Peer {
        uid: own,
        gid: nix::unistd::getgid().as_raw(),
        is_admin: true,
    };
    entries.extend(crate::namespaces::stats_entries(
        &admin,
        shared.engine.memstore(),
    ));
    entries
}

fn response(status: &str, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_unless_told() {
        assert!(check_address("127.0.0.1:9464".parse().unwrap(), false).is_ok());
        assert!(check_address("[::1]:9464".parse().unwrap(), false).is_ok());
        let refused = check_address("0.0.0.0:9464".parse().unwrap(), false).unwrap_err();
        assert!(refused.contains("--metrics-listen-any"), "{refused}");
        assert!(check_address("0.0.0.0:9464".parse().unwrap(), true).is_ok());
    }
}
