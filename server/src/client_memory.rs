//! One memory budget for every client's buffers (`--max-client-memory`),
//! like Redis's `maxmemory-clients`.
//!
//! Each connection has an [`Account`] of the bytes it holds: the body of
//! the frame it is reading (charged as the bytes arrive, never the size a
//! header declares), its answer buffer, and the writers' answers parked
//! for it while it does not read. Charging is one atomic add; only when
//! the sum passes the budget are the connections holding the most cut,
//! largest first, each with a log line, until the sum is back under it. A
//! cut connection's socket is shut down both ways, which ends its thread's
//! read or write and its slow-answer thread's send at once; its charge
//! leaves the sum at the cut, so one attacker is never cut twice and
//! nobody else is cut for memory that is already being given back.

use log::warn;
use std::collections::HashMap;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The daemon's budget and the accounts charged against it.
pub(crate) struct ClientMemory {
    limit_bytes: u64,
    used_bytes: AtomicU64,
    accounts: Mutex<HashMap<u64, Arc<Account>>>,
    /// Connections cut for memory since the start (`stats`).
    cuts: AtomicU64,
}

/// What one connection holds.
pub(crate) struct Account {
    id: u64,
    uid: u32,
    held_bytes: AtomicU64,
    cut: AtomicBool,
    /// The socket, to shut down when the connection is cut.
    stream: UnixStream,
    budget: Arc<ClientMemory>,
}

/// The connection was cut to keep the clients within the budget.
#[derive(Debug)]
pub(crate) struct Cut;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ClientMemory {
    pub(crate) fn new(limit_bytes: u64) -> Arc<ClientMemory> {
        Arc::new(ClientMemory {
            limit_bytes,
            used_bytes: AtomicU64::new(0),
            accounts: Mutex::new(HashMap::new()),
            cuts: AtomicU64::new(0),
        })
    }

    /// Opens connection `id`'s account; `stream` is shut down if it is cut.
    pub(crate) fn open(self: &Arc<Self>, id: u64, uid: u32, stream: UnixStream) -> Arc<Account> {
        let account = Arc::new(Account {
            id,
            uid,
            held_bytes: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            stream,
            budget: Arc::clone(self),
        });
        lock(&self.accounts).insert(id, Arc::clone(&account));
        account
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    pub(crate) fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }

    /// Whether the clients hold more than half the budget: connections
    /// then give back the buffers they keep between requests.
    pub(crate) fn under_pressure(&self) -> bool {
        self.used_bytes() > self.limit_bytes / 2
    }

    /// Cuts the largest holders until the sum is within the budget.
    fn enforce(&self) {
        let accounts = lock(&self.accounts);
        if self.used_bytes() <= self.limit_bytes {
            return;
        }
        let mut by_size: Vec<&Arc<Account>> = accounts
            .values()
            .filter(|a| !a.cut.load(Ordering::Relaxed))
            .collect();
        by_size.sort_by_key(|a| std::cmp::Reverse(a.held_bytes.load(Ordering::Relaxed)));
        for account in by_size {
            if self.used_bytes() <= self.limit_bytes {
                break;
            }
            account.cut_now();
        }
    }
}

impl Account {
    /// Adds `bytes` to what the connection holds; cuts the largest
    /// holders if the budget is passed. `Err` if this connection is (or
    /// already was) cut: it must stop and close.
    pub(crate) fn charge(&self, bytes: u64) -> Result<(), Cut> {
        if self.cut.load(Ordering::Relaxed) {
            return Err(Cut);
        }
        if bytes == 0 {
            return Ok(());
        }
        self.held_bytes.fetch_add(bytes, Ordering::Relaxed);
        let used = self.budget.used_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if used > self.budget.limit_bytes {
            self.budget.enforce();
        }
        if self.cut.load(Ordering::Relaxed) {
            Err(Cut)
        } else {
            Ok(())
        }
    }

    /// Gives back `bytes` charged earlier.
    pub(crate) fn release(&self, bytes: u64) {
        if bytes == 0 || self.cut.load(Ordering::Relaxed) {
            // A cut account's charge already left the sum.
            return;
        }
        let mut held = self.held_bytes.load(Ordering::Relaxed);
        loop {
            let new = held.saturating_sub(bytes);
            match self.held_bytes.compare_exchange_weak(
                held,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.budget
                        .used_bytes
                        .fetch_sub(held - new, Ordering::Relaxed);
                    return;
                }
                Err(now) => held = now,
            }
        }
    }

    /// Sets the charge to exactly `bytes` (what the buffers hold now).
    pub(crate) fn set(&self, bytes: u64) -> Result<(), Cut> {
        let held = self.held_bytes.load(Ordering::Relaxed);
        if bytes >= held {
            self.charge(bytes - held)
        } else {
            self.release(held - bytes);
            if self.cut.load(Ordering::Relaxed) {
                Err(Cut)
            } else {
                Ok(())
            }
        }
    }

    /// The connection's socket (to tell a client why it is not served).
    pub(crate) fn stream(&self) -> &UnixStream {
        &self.stream
    }

    #[cfg(test)]
    pub(crate) fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Cuts this connection: its charge leaves the sum now, its socket is
    /// shut down (which never blocks), and the operator is told.
    fn cut_now(&self) {
        if self.cut.swap(true, Ordering::Relaxed) {
            return;
        }
        let held = self.held_bytes.swap(0, Ordering::Relaxed);
        self.budget.used_bytes.fetch_sub(held, Ordering::Relaxed);
        self.budget.cuts.fetch_add(1, Ordering::Relaxed);
        warn!(
            "cut connection {} (uid {}): it held {held} bytes of buffers and all clients together \
             passed --max-client-memory {}; the largest holders are cut first",
            self.id, self.uid, self.budget.limit_bytes
        );
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let held = self.held_bytes.swap(0, Ordering::Relaxed);
        self.budget.used_bytes.fetch_sub(held, Ordering::Relaxed);
    }
}

impl ClientMemory {
    /// Closes connection `id`'s account: what it held leaves the sum once
    /// the last holder of the account (a slow-answer thread) lets go.
    pub(crate) fn close(&self, id: u64) {
        lock(&self.accounts).remove(&id);
    }

    /// Shuts the read side of every open connection (a clean shutdown):
    /// each sees end of file after answering what it is in the middle of.
    pub(crate) fn shutdown_reads(&self) {
        for account in lock(&self.accounts).values() {
            let _ = account.stream.shutdown(Shutdown::Read);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn account(budget: &Arc<ClientMemory>, id: u64) -> (Arc<Account>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        (budget.open(id, 1000, ours), theirs)
    }

    #[test]
    fn passing_the_budget_cuts_the_largest_holder_first() {
        let budget = ClientMemory::new(1000);
        let (small, _s) = account(&budget, 1);
        let (big, _b) = account(&budget, 2);
        small.charge(300).unwrap();
        big.charge(600).unwrap();
        // The small one pushes the sum over: the big one is cut, not it.
        small.charge(200).unwrap();
        assert!(big.is_cut() && !small.is_cut());
        assert_eq!(budget.used_bytes(), 500);
        assert!(big.charge(1).is_err());
        big.release(600);
        assert_eq!(budget.used_bytes(), 500);
        small.set(0).unwrap();
        assert_eq!(budget.used_bytes(), 0);
        assert_eq!(budget.cuts(), 1);
    }

    #[test]
    fn a_lone_holder_past_the_budget_is_cut_and_gives_everything_back() {
        let budget = ClientMemory::new(1000);
        let (only, _o) = account(&budget, 1);
        assert!(only.charge(1001).is_err());
        assert_eq!(budget.used_bytes(), 0);
        drop(only);
        budget.close(1);
        assert_eq!(budget.used_bytes(), 0);
    }
}
