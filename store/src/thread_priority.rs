//! Background threads yield the CPU to foreground work.
//!
//! The checkpointer folds megabytes of WAL at a time. On a machine with
//! few cores it competed, at equal priority, with the writer and a step's
//! lanes: on the development VM (2 cores) a 32^3 Game of Life step took
//! 26 ms of writer time between folds and 40 ms during one, for several
//! steps in a row. At a lower priority (a higher nice value) it takes the
//! cores' idle time first, and a fair but smaller share when there is
//! none, so it keeps up with the WAL and never starves. RocksDB lowers
//! its compaction threads' CPU priority for the same reason
//! (`Env::LowerThreadPoolCPUPriority`).

/// Nice value for background threads: a tenth of a default thread's
/// share of a contended core (CFS weights 110 against 1024).
pub(crate) const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to `nice`, never raising it
/// (a daemon started at a higher nice value keeps it). Raising a nice
/// value needs no privilege; if it fails anyway, the thread runs as it
/// would have.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub(crate) fn lower_this_thread(nice: i32) {
    // SAFETY: `gettid` and `setpriority` take no pointers and touch no
    // memory of this process; on Linux, `PRIO_PROCESS` with a thread id
    // sets that one thread's nice value.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        // -1 is both a nice value and the error return: either way, not
        // above `nice`, so the thread is lowered.
        if libc::getpriority(libc::PRIO_PROCESS, tid) < nice {
            libc::setpriority(libc::PRIO_PROCESS, tid, nice);
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_this_thread(_nice: i32) {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The nice value of the calling thread, from `/proc/thread-self/stat`
    /// (field 19, after the parenthesised name).
    fn own_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn lowers_only_the_calling_thread() {
        let before = own_nice();
        let lowered = std::thread::spawn(|| {
            lower_this_thread(BACKGROUND_NICE);
            own_nice()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, BACKGROUND_NICE.max(before));
        assert_eq!(own_nice(), before);
    }
}
