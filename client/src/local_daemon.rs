//! [`LocalDaemon`]: a real `cubed` process on a throwaway data directory.
//!
//! Integration tests, the stress driver and the `cubec` tests all need a
//! daemon they can start, crash (`kill -9`), stop cleanly and restart on the
//! same data, and whose log they can show when something fails.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::client::Client;
use crate::error::ClientError;

/// Overrides where [`LocalDaemon::find_binary`] looks.
pub const BINARY_ENV_VAR: &str = "CUBED_BIN";

/// A cold start replays the whole log; on a loaded CI machine that can take
/// a while, and a false "did not start" is worse than a slow failure.
const READY_DEADLINE: Duration = Duration::from_secs(20);
/// A clean shutdown drains in-flight writes and syncs; past this the daemon
/// is considered hung.
const TERMINATE_DEADLINE: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Clients handed out by [`LocalDaemon::client`] fail a wedged test instead
/// of hanging it forever.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

pub struct LocalDaemon {
    /// `None` once the process has been killed or terminated and reaped.
    child: Option<Child>,
    pid: u32,
    binary: PathBuf,
    data_dir: PathBuf,
    socket: PathBuf,
    extra_args: Vec<String>,
    log_path: PathBuf,
    /// Keeps a [`LocalDaemon::start_fresh`] directory alive; deleted only
    /// after `Drop` has killed the process, since fields drop after it.
    _temp_dir: Option<TempDir>,
}

impl LocalDaemon {
    /// `$CUBED_BIN`, else `cubed` beside the running executable or in its
    /// parent directory (test binaries live in `target/<profile>/deps/`).
    pub fn find_binary() -> Result<PathBuf, ClientError> {
        if let Some(path) = std::env::var_os(BINARY_ENV_VAR).filter(|p| !p.is_empty()) {
            let path = PathBuf::from(path);
            if path.is_file() {
                return Ok(path);
            }
            return Err(ClientError::Daemon(format!(
                "${BINARY_ENV_VAR} is {} but there is no file there; fix or unset it, \
                 or build cubed with `cargo build -p cube-server`",
                path.display()
            )));
        }
        let exe = std::env::current_exe()?;
        let mut searched = Vec::new();
        for dir in exe.ancestors().skip(1).take(2) {
            let candidate = dir.join("cubed");
            if candidate.is_file() {
                return Ok(candidate);
            }
            searched.push(candidate.display().to_string());
        }
        Err(ClientError::Daemon(format!(
            "cannot find the cubed binary (looked at {}); build it with \
             `cargo build -p cube-server`, or set ${BINARY_ENV_VAR} to its path",
            searched.join(", ")
        )))
    }

    /// Starts a daemon on a new temporary directory (`data/` and
    /// `cubed.sock` inside), deleted when this value drops.
    pub fn start_fresh(extra_args: &[&str]) -> Result<LocalDaemon, ClientError> {
        let temp_dir = tempfile::Builder::new().prefix("cube-test-").tempdir()?;
        let data_dir = temp_dir.path().join("data");
        let socket = temp_dir.path().join("cubed.sock");
        let mut daemon = LocalDaemon::new(&data_dir, &socket, extra_args)?;
        daemon._temp_dir = Some(temp_dir);
        daemon.spawn_and_wait_ready()?;
        Ok(daemon)
    }

    /// Starts a daemon on a caller-owned data directory and socket path. The
    /// log goes next to the socket (`<socket>.log` with the extension
    /// replaced).
    pub fn start_in(
        data_dir: &Path,
        socket: &Path,
        extra_args: &[&str],
    ) -> Result<LocalDaemon, ClientError> {
        let mut daemon = LocalDaemon::new(data_dir, socket, extra_args)?;
        daemon.spawn_and_wait_ready()?;
        Ok(daemon)
    }

    fn new(
        data_dir: &Path,
        socket: &Path,
        extra_args: &[&str],
    ) -> Result<LocalDaemon, ClientError> {
        Ok(LocalDaemon {
            child: None,
            pid: 0,
            binary: LocalDaemon::find_binary()?,
            data_dir: data_dir.to_owned(),
            socket: socket.to_owned(),
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            log_path: socket.with_extension("log"),
            _temp_dir: None,
        })
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A new connection with read/write timeouts of a minute, so a wedged
    /// daemon fails the caller instead of hanging it.
    pub fn client(&self) -> Result<Client, ClientError> {
        let mut client = Client::connect(&self.socket)?;
        client.set_timeout(Some(CLIENT_TIMEOUT))?;
        Ok(client)
    }

    /// The process id of the current (or last) daemon process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the daemon process is still running (and not yet reaped).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Crashes the daemon: SIGKILL, then reap it. A no-op if it is already
    /// gone.
    pub fn kill9(&mut self) -> Result<(), ClientError> {
        if let Some(mut child) = self.child.take() {
            // Fails only if the process already exited; `wait` reaps either way.
            let _ = child.kill();
            child.wait()?;
        }
        Ok(())
    }

    /// Asks for a clean shutdown (SIGTERM) and waits for the exit status.
    /// A daemon still running after 30 s is killed and reported as hung.
    pub fn terminate(&mut self) -> Result<ExitStatus, ClientError> {
        let Some(mut child) = self.child.take() else {
            return Err(ClientError::Daemon(format!(
                "cubed (pid {}) is not running; start it with restart()",
                self.pid
            )));
        };
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        send_sigterm(self.pid)?;
        let deadline = Instant::now() + TERMINATE_DEADLINE;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                child.wait()?;
                return Err(ClientError::Daemon(format!(
                    "cubed (pid {}) did not exit within {}s of SIGTERM and was killed; log {}:\n{}",
                    self.pid,
                    TERMINATE_DEADLINE.as_secs(),
                    self.log_path.display(),
                    self.log_text()
                )));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Starts the daemon again on the same data directory, socket and
    /// arguments, after [`kill9`](Self::kill9) or
    /// [`terminate`](Self::terminate).
    pub fn restart(&mut self) -> Result<(), ClientError> {
        if self.is_running() {
            return Err(ClientError::Daemon(format!(
                "cubed (pid {}) is still running; call kill9() or terminate() before restart()",
                self.pid
            )));
        }
        // Reap a process that exited on its own so it does not linger.
        if let Some(mut child) = self.child.take() {
            child.wait()?;
        }
        self.spawn_and_wait_ready()
    }

    /// Where the daemon's stdout and stderr are appended, across restarts.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Everything the daemon has logged so far (lossily decoded).
    pub fn log_text(&self) -> String {
        match fs::read(&self.log_path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("(cannot read {}: {e})", self.log_path.display()),
        }
    }

    fn spawn_and_wait_ready(&mut self) -> Result<(), ClientError> {
        if let Some(parent) = self.data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent)?;
        }
        // A file, not a pipe: nobody has to drain it, so a chatty daemon can
        // never block on a full pipe while a test is not looking.
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        writeln!(
            log,
            "--- LocalDaemon: {} --data {} --socket {} {}",
            self.binary.display(),
            self.data_dir.display(),
            self.socket.display(),
            self.extra_args.join(" ")
        )?;
        let child = Command::new(&self.binary)
            .arg("--data")
            .arg(&self.data_dir)
            .arg("--socket")
            .arg(&self.socket)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                ClientError::Daemon(format!("cannot start {}: {e}", self.binary.display()))
            })?;
        self.pid = child.id();
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), ClientError> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(ClientError::Daemon(format!(
                    "cubed (pid {}) exited with {status} before it was ready; log {}:\n{}",
                    self.pid,
                    self.log_path.display(),
                    self.log_text()
                )));
            }
            match Client::connect(&self.socket) {
                Ok(_) => return Ok(()),
                // A different protocol will not fix itself by waiting.
                Err(e @ ClientError::VersionMismatch { .. }) => return Err(e),
                Err(e) if Instant::now() >= deadline => {
                    self.kill9()?;
                    return Err(ClientError::Daemon(format!(
                        "cubed (pid {}) was not ready within {}s (last attempt: {e}) and was \
                         killed; log {}:\n{}",
                        self.pid,
                        READY_DEADLINE.as_secs(),
                        self.log_path.display(),
                        self.log_text()
                    )));
                }
                Err(_) => thread::sleep(POLL_INTERVAL),
            }
        }
    }
}

impl Drop for LocalDaemon {
    fn drop(&mut self) {
        // Never leave a daemon behind a finished or panicking test.
        let _ = self.kill9();
    }
}

impl std::fmt::Debug for LocalDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalDaemon")
            .field("pid", &self.pid)
            .field("running", &self.child.is_some())
            .field("data_dir", &self.data_dir)
            .field("socket", &self.socket)
            .field("extra_args", &self.extra_args)
            .field("log_path", &self.log_path)
            .finish_non_exhaustive()
    }
}

#[allow(unsafe_code)]
fn send_sigterm(pid: u32) -> Result<(), ClientError> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| ClientError::Daemon(format!("pid {pid} does not fit in pid_t")))?;
    // SAFETY: kill(2) reads no memory of ours. The pid is our own child that
    // has not been reaped yet (we hold its `Child` and only `wait` after
    // this), so it cannot have been recycled for an unrelated process.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    if rc == 0 {
        Ok(())
    } else {
        Err(ClientError::Io(std::io::Error::last_os_error()))
    }
}
