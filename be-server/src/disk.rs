//! The disk space guard (RabbitMQ's `disk_free_limit`): while the disk holding the data directory
//! has less free space than `disk_free_min_bytes`, sends to durable queues are refused, and so is
//! the commit of a transaction that staged sends. Everything that frees space keeps working:
//! receives, acknowledgements, nacks, dead-letter moves, purges, deletes.
//!
//! The free space is looked up (statvfs) at most every [`LOOK_INTERVAL_MS`], off the async
//! runtime: a send reads the last answer and, when it is old, starts one look on a blocking
//! thread without waiting for it.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use ferry_kernel::SessionId;

use crate::error::Error;

/// The longest a send relies on one look at the disk.
pub(crate) const LOOK_INTERVAL_MS: u64 = 500;

/// Free space of the disk holding one directory, looked up now and then.
#[derive(Debug)]
pub(crate) struct DiskGuard {
    dir: PathBuf,
    free_min_bytes: u64,
    started: Instant,
    /// Milliseconds after `started` when the last look began.
    looked_ms: AtomicU64,
    /// Free bytes at the last look that succeeded; `u64::MAX` while none has.
    free_bytes: AtomicU64,
    /// Whether sends are being refused (for logging the changes only).
    low: AtomicBool,
}

impl DiskGuard {
    /// Looks at the disk once, now (it may block briefly: call it off the async runtime).
    pub(crate) fn new(dir: PathBuf, free_min_bytes: u64) -> Arc<Self> {
        let guard = Arc::new(Self {
            dir,
            free_min_bytes,
            started: Instant::now(),
            looked_ms: AtomicU64::new(0),
            free_bytes: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
        });
        guard.look();
        guard
    }

    /// `Err(DiskFull)` if the last look found too little free space. Starts a new look when the
    /// last one is older than [`LOOK_INTERVAL_MS`]; never waits for it.
    pub(crate) fn check(self: &Arc<Self>) -> Result<(), Error> {
        let now = self.elapsed_ms();
        let last = self.looked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= LOOK_INTERVAL_MS
            && self
                .looked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let me = Arc::clone(self);
            match tokio::runtime::Handle::try_current() {
                // The blocking task makes one system call and ends.
                Ok(rt) => drop(rt.spawn_blocking(move || me.look())),
                Err(_) => me.look(),
            }
        }
        let free_bytes = self.free_bytes.load(Ordering::Relaxed);
        if free_bytes < self.free_min_bytes {
            return Err(Error::DiskFull {
                free_bytes,
                limit_bytes: self.free_min_bytes,
            });
        }
        Ok(())
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Reads the free space; a failed read keeps the last value (and says so in the log).
    fn look(&self) {
        let free_bytes = match free_bytes(&self.dir) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the free space of the data directory's disk; disk_free_min_bytes is judged on the last reading");
                return;
            }
        };
        self.free_bytes.store(free_bytes, Ordering::Relaxed);
        let low = free_bytes < self.free_min_bytes;
        if self.low.swap(low, Ordering::Relaxed) != low {
            if low {
                tracing::warn!(dir = %self.dir.display(), free_bytes, disk_free_min_bytes = self.free_min_bytes, "free disk space is under disk_free_min_bytes: refusing sends until there is more");
            } else {
                tracing::info!(dir = %self.dir.display(), free_bytes, disk_free_min_bytes = self.free_min_bytes, "free disk space is back over disk_free_min_bytes: taking sends again");
            }
        }
    }
}

/// Bytes an unprivileged process may still write on the file system holding `dir`.
#[cfg(unix)]
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(not(unix))]
fn free_bytes(_dir: &std::path::Path) -> std::io::Result<u64> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "free space is only read on Unix",
    ))
}

/// Decides which sends may go ahead: the disk guard (none for a store without a disk, or a
/// limit of 0), and which transacted sessions have staged sends, whose commit writes them.
#[derive(Debug)]
pub(crate) struct SendGate {
    disk: Option<Arc<DiskGuard>>,
    /// Sessions that staged sends in a durable queue since their last commit or rollback.
    staging: Mutex<HashSet<SessionId>>,
}

impl SendGate {
    pub(crate) fn new(disk: Option<Arc<DiskGuard>>) -> Self {
        Self {
            disk,
            staging: Mutex::new(HashSet::new()),
        }
    }

    /// The free bytes last read (`u64::MAX` before any reading succeeded) and the limit.
    pub(crate) fn disk_free(&self) -> Option<(u64, u64)> {
        self.disk
            .as_ref()
            .map(|d| (d.free_bytes.load(Ordering::Relaxed), d.free_min_bytes))
    }

    /// Before a send (or a staged send) to a durable queue.
    pub(crate) fn before_send(&self) -> Result<(), Error> {
        self.disk.as_ref().map_or(Ok(()), DiskGuard::check)
    }

    /// A session staged sends in a durable queue.
    pub(crate) fn staged(&self, session: SessionId) {
        if self.disk.is_some() {
            self.sessions().insert(session);
        }
    }

    /// Before a commit: refused if the session staged sends and the disk is short of space.
    /// Either way the session has no staged sends once the commit (or its rollback) is done.
    pub(crate) fn before_tx_commit(&self, session: SessionId) -> Result<(), Error> {
        if self.sessions().remove(&session) {
            self.before_send()
        } else {
            Ok(())
        }
    }

    /// The session's staged sends were dropped (rollback, or the session ended).
    pub(crate) fn tx_ended(&self, session: SessionId) {
        if self.disk.is_some() {
            self.sessions().remove(&session);
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashSet<SessionId>> {
        self.staging.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u64) -> SessionId {
        SessionId(n)
    }

    #[test]
    fn a_limit_over_the_free_space_refuses_sends_and_names_the_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let guard = DiskGuard::new(dir.path().into(), u64::MAX);
        let err = guard.check().expect_err("no disk has u64::MAX bytes free");
        assert!(matches!(
            err,
            Error::DiskFull {
                limit_bytes: u64::MAX,
                ..
            }
        ));
        assert!(err.to_string().contains("disk_free_min_bytes"), "{err}");
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn a_limit_of_zero_never_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let guard = DiskGuard::new(dir.path().into(), 0);
        assert!(guard.check().is_ok());
        assert!(guard.free_bytes.load(Ordering::Relaxed) < u64::MAX);
    }

    #[test]
    fn an_unreadable_directory_does_not_refuse_sends() {
        let guard = DiskGuard::new("/nonexistent/ferry/data".into(), 1);
        assert!(guard.check().is_ok());
    }

    #[test]
    fn only_a_commit_of_staged_sends_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gate = SendGate::new(Some(DiskGuard::new(dir.path().into(), u64::MAX)));
        assert!(gate.before_tx_commit(session(1)).is_ok(), "acks only");
        gate.staged(session(1));
        assert!(gate.before_tx_commit(session(1)).is_err());
        assert!(gate.before_tx_commit(session(1)).is_ok(), "rolled back");
        gate.staged(session(2));
        gate.tx_ended(session(2));
        assert!(gate.before_tx_commit(session(2)).is_ok());
    }
}
