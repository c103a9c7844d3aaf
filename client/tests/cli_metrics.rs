//! Prometheus metrics, checked by Prometheus's own tool: `cubed
//! --metrics-listen` answers `GET /metrics` while it serves clients,
//! `cubec stats --prometheus` prints the same families, and `promtool check
//! metrics` (Debian's prometheus package; `make test` installs it) accepts
//! both: counters as counters, latencies as histograms, namespaces and
//! commands as labels.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use cube_client::LocalDaemon;
use support::{assert_exit, cubec, stderr, stdout};

#[track_caller]
fn assert_line(text: &str, prefix: &str) {
    assert!(
        text.lines().any(|line| line.starts_with(prefix)),
        "no line starting {prefix:?} in:\n{text}"
    );
}

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): `make test` installs it (Debian's prometheus \
                 package: apt-get install prometheus); install it to run this test alone"
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// The address cubed logged for its metrics (port 0 picks one).
fn metrics_address(daemon: &LocalDaemon) -> String {
    let log = daemon.log_text();
    let at = log
        .find("metrics on http://")
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"));
    let rest = &log[at + "metrics on http://".len()..];
    rest[..rest.find('/').unwrap()].to_owned()
}

/// One HTTP/1.1 request; the whole answer (cubed closes the connection).
fn http(address: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn metrics_are_served_over_http_and_pass_promtool() {
    let daemon = LocalDaemon::start_fresh(&["--metrics-listen", "127.0.0.1:0"]).unwrap();
    let s = daemon.socket();
    assert_exit(&cubec(s, &["put", "default", "1,2,3", "hello"]), 0);
    assert_exit(&cubec(s, &["get", "default", "1,2,3"]), 0);
    assert_exit(&cubec(s, &["get", "default", "9,9,9"]), 1);
    assert_exit(&cubec(s, &["ns", "create", "tenant-a"]), 0);
    // A client stays connected while the scrape happens.
    let mut client = daemon.client().unwrap();
    client.ping().unwrap();

    let address = metrics_address(&daemon);
    let answer = http(
        &address,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n",
    );
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let (ok, said) = promtool_check(body);
    assert!(ok, "promtool check metrics failed: {said}\n{body}");

    assert_line(body, "# TYPE cube_commands_total counter");
    assert_line(body, "cube_commands_total{command=\"get\"} 2");
    assert_line(body, "# TYPE cube_command_duration_seconds histogram");
    assert_line(
        body,
        "cube_command_duration_seconds_bucket{command=\"put\",le=\"+Inf\"} 1",
    );
    assert_line(
        body,
        "cube_command_duration_seconds_count{command=\"get\"} 2",
    );
    assert_line(body, "cube_command_duration_seconds_sum{command=\"get\"} ");
    assert_line(body, "cube_namespace_cells{namespace=\"default\"} 1");
    assert_line(body, "cube_namespace_cells{namespace=\"tenant-a\"} 0");
    assert_line(body, "# TYPE cube_wal_fsyncs_total counter");
    assert!(!body.contains("cube_ns_"), "namespaces are labels:\n{body}");

    // The same exposition from cubec (the figures move between the two
    // reads; the families, types and labels do not).
    let out = cubec(s, &["stats", "--prometheus"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    let (ok, said) = promtool_check(&text);
    assert!(
        ok,
        "promtool check metrics failed on cubec's: {said}\n{text}"
    );
    let types = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("# TYPE"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(types(&text), types(body));

    // Anything else is refused plainly, and the daemon keeps serving.
    let answer = http(&address, "GET / HTTP/1.1\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    let answer = http(&address, "POST /metrics HTTP/1.1\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    client.ping().unwrap();
}

#[test]
fn metrics_listen_refuses_a_non_loopback_address_unless_told() {
    let temp = tempfile::tempdir().unwrap();
    let out = Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--data")
        .arg(temp.path().join("data"))
        .args(["--metrics-listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("not a loopback address"), "{err}");
    assert!(err.contains("--metrics-listen-any"), "{err}");
    // Nothing was started on the data dir.
    assert!(!temp.path().join("data").exists());
}
