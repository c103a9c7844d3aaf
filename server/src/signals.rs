//! What each signal does to `cubed` (`docs/operations.md`, "Signals").
//!
//! Without a handler, most signals kill a process at once: no log line,
//! no final checkpoint, a client cut mid-answer, a half-written `.tmp`
//! file. So every signal whose default is to terminate gets one:
//!
//! - SIGINT, SIGTERM and the signals nobody should send a daemon
//!   (SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
//!   SIGXCPU, SIGSYS) take the clean shutdown, with a log line naming the
//!   signal. A second one exits at once (acknowledged writes are durable).
//! - SIGHUP, by convention "reopen your log file": cubed logs to stderr
//!   and keeps no file, so it only says so.
//! - SIGXFSZ (a file reached `ulimit -f`) is caught and otherwise ignored:
//!   the write that crossed the limit fails with `EFBIG`, which the usual
//!   paths handle (a checkpoint fails and is retried; a log write latches
//!   the writer).
//!
//! SIGPIPE is ignored by the Rust runtime already.

use log::{info, warn};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use mio::Waker;
use signal_hook::consts::{
    SIGALRM, SIGHUP, SIGINT, SIGIO, SIGPROF, SIGSYS, SIGTERM, SIGUSR1, SIGUSR2, SIGVTALRM, SIGXCPU,
    SIGXFSZ,
};
use signal_hook::iterator::Signals;

/// Signals that stop cubed cleanly.
pub const STOP_SIGNALS: &[i32] = &[
    SIGINT,
    SIGTERM,
    SIGUSR1,
    SIGUSR2,
    SIGALRM,
    SIGVTALRM,
    SIGPROF,
    SIGIO,
    libc::SIGPWR,
    SIGXCPU,
    SIGSYS,
];

/// The signal's name for the log (`SIGUSR1`).
fn signal_name(signal: i32) -> String {
    let known = [
        (SIGINT, "SIGINT"),
        (SIGTERM, "SIGTERM"),
        (SIGUSR1, "SIGUSR1"),
        (SIGUSR2, "SIGUSR2"),
        (SIGALRM, "SIGALRM"),
        (SIGVTALRM, "SIGVTALRM"),
        (SIGPROF, "SIGPROF"),
        (SIGIO, "SIGIO"),
        (libc::SIGPWR, "SIGPWR"),
        (SIGXCPU, "SIGXCPU"),
        (SIGSYS, "SIGSYS"),
        (SIGHUP, "SIGHUP"),
        (SIGXFSZ, "SIGXFSZ"),
    ];
    known
        .iter()
        .find(|(number, _)| *number == signal)
        .map_or_else(
            || format!("signal {signal}"),
            |(_, name)| (*name).to_string(),
        )
}

/// Starts the thread that turns signals into their actions; `stop` and
/// `waker` end the reactor's loop.
pub fn watch(stop: Arc<AtomicBool>, waker: Arc<Waker>) -> std::io::Result<()> {
    let mut handled = STOP_SIGNALS.to_vec();
    handled.extend([SIGHUP, SIGXFSZ]);
    let mut signals = Signals::new(handled)?;
    thread::Builder::new()
        .name("cube-signals".into())
        .spawn(move || {
            let mut stops = 0;
            let mut file_size_signals = 0u64;
            for signal in signals.forever() {
                let name = signal_name(signal);
                match signal {
                    SIGHUP => info!(
                        "{name} received: cubed logs to stderr and keeps no log file to reopen, \
                         so there is nothing to do (SIGTERM stops it)"
                    ),
                    SIGXFSZ => {
                        file_size_signals += 1;
                        // Once: each write past the limit raises another.
                        if file_size_signals == 1 {
                            warn!(
                                "{name} received: a file reached the file-size limit (ulimit -f); \
                                 the write fails with EFBIG and is handled as a failed write. \
                                 Raise the limit (LimitFSIZE= in a service unit)"
                            );
                        }
                    }
                    _ => {
                        stops += 1;
                        if stops == 1 {
                            info!("{name} received: shutting down cleanly");
                            stop.store(true, Ordering::SeqCst);
                            let _ = waker.wake();
                        } else {
                            // Acknowledged writes are already durable; a second
                            // signal only gives up on waiting for slow clients.
                            warn!("second stop signal {name}: exiting now");
                            std::process::exit(1);
                        }
                    }
                }
            }
        })?;
    Ok(())
}
