//! What differs between two copies of the metadata, queue by queue: how a follower of the
//! published states (the node's back-end, the router's placement) carries out a change in
//! proportion to what it changed, however many queues there are.

use ferry_kernel::QueueName;
use imbl::ordmap::DiffItem;

use super::state::{MetaState, QueueDef};

/// A queue whose definition differs between two states ([`MetaState::queue_changes`]). A
/// queue deleted and created again between them is one change, with two different epochs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueChange<'a> {
    /// The queue.
    pub name: &'a QueueName,
    /// Its definition in the earlier state (`None`: it did not exist).
    pub before: Option<&'a QueueDef>,
    /// Its definition in the later state (`None`: it no longer exists).
    pub after: Option<&'a QueueDef>,
}

impl MetaState {
    /// The queues whose definitions differ between `self` (earlier) and `later`, in name
    /// order. Costs in proportion to the changes, times log n, when `later` was made from
    /// `self` (or both from one state) by applying commands: the two share every part of the
    /// queue map that no command touched, and shared parts are skipped unread. After a
    /// snapshot was installed nothing is shared, and every queue is compared.
    pub fn queue_changes<'a>(
        &'a self,
        later: &'a MetaState,
    ) -> impl Iterator<Item = QueueChange<'a>> + 'a {
        self.queues.diff(&later.queues).map(|item| match item {
            DiffItem::Add(name, def) => QueueChange {
                name,
                before: None,
                after: Some(def),
            },
            DiffItem::Update {
                old: (name, old),
                new: (_, new),
            } => QueueChange {
                name,
                before: Some(old),
                after: Some(new),
            },
            DiffItem::Remove(name, def) => QueueChange {
                name,
                before: Some(def),
                after: None,
            },
        })
    }
}
