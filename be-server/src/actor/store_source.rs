//! The store as a queue's paging reads it.

use ferry_kernel::{Queue, RecoveredMessage, Seq};
use ferry_store::{QueueStore, StoreError};

/// The store as a queue's paging may read it: only what is applied, so a read can never step
/// over a message whose write is still on its way.
pub(super) struct StoreSource<'a> {
    store: &'a dyn QueueStore,
    uid: ferry_kernel::QueueUid,
    upto: Seq,
    settled: bool,
}

impl<'a> StoreSource<'a> {
    /// `settled`: no write of the queue is on its way; else every message write below `applied`
    /// is done.
    pub(super) fn new(
        store: &'a dyn QueueStore,
        queue: &Queue,
        settled: bool,
        applied: Seq,
    ) -> Self {
        Self {
            store,
            uid: queue.uid(),
            upto: if settled { Seq(u64::MAX) } else { applied },
            settled,
        }
    }
}

impl ferry_kernel::PageSource for StoreSource<'_> {
    type Error = StoreError;

    fn read_page(
        &self,
        p: ferry_kernel::Priority,
        from: Seq,
        max_count: usize,
        max_bytes: u64,
    ) -> Result<ferry_kernel::Page, StoreError> {
        let page = self
            .store
            .read_page(self.uid, p, from, self.upto, max_count, max_bytes)?;
        Ok(ferry_kernel::Page {
            messages: page.messages,
            next: page.next,
            end: page.end,
        })
    }

    fn settled(&self) -> bool {
        self.settled
    }

    fn find_by_header(
        &self,
        header: ferry_kernel::IndexedHeader,
        value: &str,
        max: usize,
    ) -> Result<Vec<(ferry_kernel::Priority, Seq)>, StoreError> {
        self.store.find_by_header(self.uid, header, value, max)
    }

    fn read_messages(
        &self,
        keys: &[(ferry_kernel::Priority, Seq)],
    ) -> Result<Vec<RecoveredMessage>, StoreError> {
        Ok(self
            .store
            .read_messages(self.uid, keys)?
            .into_iter()
            .filter(|m| m.message.seq < self.upto)
            .collect())
    }
}
