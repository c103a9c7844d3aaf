//! One panic policy for every thread of `cubed`: say what happened, then
//! abort the process.
//!
//! A panic means an invariant the code relies on is broken. Unwinding would
//! let the other threads carry on from a state nobody reasoned about: a
//! connection thread could leak its slot, a checkpointer could leave a fold
//! half done, a lock would be poisoned under readers that ignore poisoning.
//! Aborting is always safe instead: every acknowledged write is already in
//! the log, the next start recovers from it (`store/tests/writer_panic.rs`),
//! and clients see a closed socket rather than a daemon that half works.
//! The same rule holds in debug and release builds, so tests see what
//! production does.

/// Installs the policy. Call it first in `main`, before any thread starts.
pub fn install() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // The standard report first: message, location and, under
        // RUST_BACKTRACE, the backtrace.
        report(info);
        let thread = std::thread::current();
        eprintln!(
            "cubed: a panic on thread '{}' is a bug; aborting so that the next start \
             recovers from the log (no acknowledged write is lost)",
            thread.name().unwrap_or("unnamed")
        );
        std::process::abort();
    }));
}
