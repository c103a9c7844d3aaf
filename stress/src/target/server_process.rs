//! A peer's server process that the driver started (`redis-server`, the
//! ceiling server): waited for until it answers, killed on drop, its log
//! at hand for error reports.

use std::fs;
use std::path::PathBuf;
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::StressError;

/// How long a started server may take to answer.
const READY_DEADLINE: Duration = Duration::from_secs(20);

pub struct ServerProcess {
    /// `None` once the process has been reaped.
    child: Option<Child>,
    /// What to call it in errors (`redis-server`, `the ceiling server`).
    name: &'static str,
    /// Its log (or its stderr).
    log: PathBuf,
}

impl ServerProcess {
    pub fn new(child: Child, name: &'static str, log: PathBuf) -> ServerProcess {
        ServerProcess {
            child: Some(child),
            name,
            log,
        }
    }

    /// Waits until `answers` says the server serves; an error, with the
    /// log, if the process exits first or takes longer than
    /// [`READY_DEADLINE`]. `target` names the target in the error.
    pub fn wait_ready(
        &mut self,
        target: &str,
        mut answers: impl FnMut() -> bool,
    ) -> Result<(), StressError> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(StressError::target(
                    target,
                    format!(
                        "{} exited with {status} before it was ready; its log:\n{}",
                        self.name,
                        self.log_text()
                    ),
                ));
            }
            if answers() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StressError::target(
                    target,
                    format!(
                        "{} was not ready within {}s; its log:\n{}",
                        self.name,
                        READY_DEADLINE.as_secs(),
                        self.log_text()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// The process id, `None` once it has been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Throwaway data: no need for a clean shutdown.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
