//! The scale benchmark's own `cubed`: started on the data set's directory
//! (which outlives it, unlike `LocalDaemon`'s throwaway one), timed from
//! its start to its first answer, stopped cleanly so the data set can be
//! reused, and its memory read from `/proc`.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::Client;

use crate::error::StressError;
use crate::keyspace::{coord_of, decode_value};

/// How long a start may take: today's cubed loads every cell before it
/// serves (about 1.3 s per 10 M cells), so a big data set takes a while.
const READY_DEADLINE: Duration = Duration::from_secs(900);
/// A clean shutdown syncs and may write a checkpoint of everything.
const STOP_DEADLINE: Duration = Duration::from_secs(900);
/// How often a starting daemon is tried: the restart figure is at most
/// this much late.
const POLL_INTERVAL: Duration = Duration::from_millis(1);
/// The namespace the data set lives in.
pub const NAMESPACE: &str = "default";

pub struct ScaleDaemon {
    /// `None` once it has been stopped and reaped.
    child: Option<Child>,
    pid: u32,
    socket: PathBuf,
    log: PathBuf,
}

/// The socket and log of the daemon on data set directory `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("cubed.sock")
}

impl ScaleDaemon {
    /// Starts `binary` on `dir/data` with `args`; returns it once it
    /// answered its first request (a get of key 0, checked when the data
    /// set holds it), and how long that took from the spawn.
    pub fn start(
        binary: &Path,
        dir: &Path,
        args: &[String],
        holds_key_0: bool,
    ) -> Result<(ScaleDaemon, Duration), StressError> {
        let socket = socket_path(dir);
        let log = dir.join("cubed.log");
        let log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| StressError::io(format!("cannot open {}", log.display()), e))?;
        let clone = log_file
            .try_clone()
            .map_err(|e| StressError::io("cannot share the daemon's log", e))?;
        let started = Instant::now();
        let child = Command::new(binary)
            .arg("--data")
            .arg(dir.join("data"))
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(clone)
            .stderr(log_file)
            .spawn()
            .map_err(|e| StressError::io(format!("cannot start {}", binary.display()), e))?;
        let mut daemon = ScaleDaemon {
            pid: child.id(),
            child: Some(child),
            socket,
            log,
        };
        let mut client = daemon.wait_ready(started)?;
        let answer = client
            .get(NAMESPACE, coord_of(0))
            .map_err(|e| daemon.failed(&format!("its first get failed: {e}")))?;
        let elapsed = started.elapsed();
        if holds_key_0 {
            let found = answer
                .ok_or_else(|| daemon.failed("key 0 of the data set is missing"))
                .and_then(|bytes| {
                    decode_value(&bytes, bytes.len()).map_err(|e| daemon.failed(&e))
                })?;
            if (found.key, found.version) != (0, 1) {
                return Err(daemon.failed(&format!(
                    "key 0 holds key {} version {}, not version 1 of key 0",
                    found.key, found.version
                )));
            }
        }
        Ok((daemon, elapsed))
    }

    fn wait_ready(&mut self, started: Instant) -> Result<Client, StressError> {
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(self.failed(&format!("it exited with {status} before serving")));
            }
            match Client::connect(&self.socket) {
                Ok(client) => return Ok(client),
                Err(e) if started.elapsed() >= READY_DEADLINE => {
                    return Err(self.failed(&format!(
                        "it did not serve within {} s (last attempt: {e})",
                        READY_DEADLINE.as_secs()
                    )));
                }
                Err(_) => thread::sleep(POLL_INTERVAL),
            }
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Resident memory now, in bytes (0 if unreadable).
    pub fn rss_bytes(&self) -> u64 {
        proc_status_kib(self.pid, "VmRSS") * 1024
    }

    /// The most resident memory since the process started, in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        proc_status_kib(self.pid, "VmHWM") * 1024
    }

    /// A clean shutdown (SIGTERM), which must exit 0: a data set is kept
    /// only after one.
    pub fn stop(mut self) -> Result<(), StressError> {
        let Some(mut child) = self.child.take() else {
            return Err(self.failed("it is not running"));
        };
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .map_err(|e| StressError::io("cannot run kill(1)", e))?;
        if !sent.success() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(self.failed(&format!("kill -TERM {} failed: {sent}", self.pid)));
        }
        let status = wait_with_deadline(&mut child, STOP_DEADLINE)
            .map_err(|e| StressError::io("cannot wait for cubed", e))?;
        match status {
            Some(status) if status.success() => Ok(()),
            Some(status) => Err(self.failed(&format!("its clean shutdown exited with {status}"))),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(self.failed(&format!(
                    "it did not exit within {} s of SIGTERM and was killed",
                    STOP_DEADLINE.as_secs()
                )))
            }
        }
    }

    /// An error naming the daemon, with the end of its log.
    fn failed(&self, what: &str) -> StressError {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        StressError::target(
            "cube",
            format!(
                "cubed (pid {}) on {}: {what}; the end of its log {}:\n{}",
                self.pid,
                self.socket.display(),
                self.log.display(),
                tail.join("\n")
            ),
        )
    }
}

impl Drop for ScaleDaemon {
    fn drop(&mut self) {
        // A run that failed midway: never leave a daemon behind.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_with_deadline(
    child: &mut Child,
    deadline: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    let until = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`), 0 if unreadable.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let rest = line.strip_prefix(field)?.strip_prefix(':')?;
                rest.trim().trim_end_matches("kB").trim().parse().ok()
            })
        })
        .unwrap_or(0)
}
