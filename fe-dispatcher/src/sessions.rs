//! Connections and sessions held by this front-end. A connection is a lease renewed by heartbeats
//! and by any call that names it or one of its sessions; when it runs out, the connection is
//! closed exactly as if the client had closed it. Plain data behind a `std::sync::Mutex`, never
//! held across an `.await`: closing returns what the caller must then release on the back-ends.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use ferry_kernel::{LeaseId, NodeId, QueueName, ReceiptHandle, Seq, SessionId};
use ferry_proto::pb::AckMode;
use tokio::time::{Duration, Instant};

use crate::error::Error;
use crate::FrontendConfig;

#[derive(Debug)]
struct Connection {
    client_id: String,
    /// Where the client connected from (`host:port`; empty if unknown).
    client_address: String,
    /// When it was opened.
    opened: Instant,
    lease: Duration,
    expires_at: Instant,
    sessions: BTreeSet<SessionId>,
    temporary_queues: BTreeSet<QueueName>,
    temporary_seq: u64,
}

#[derive(Debug)]
struct Session {
    connection: String,
    ack_mode: AckMode,
    /// Queues this session received from or staged sends in: where its leases and uncommitted
    /// sends may be.
    queues: HashSet<QueueName>,
    /// The deliveries this front-end passed on to the client, by queue: message and lease.
    /// Heartbeats renew these alone, so a delivery whose answer was lost on its way here runs
    /// out and is redelivered. Settled ones are forgotten when a renewal finds them gone.
    held: HashMap<QueueName, HashMap<Seq, LeaseId>>,
    /// Replicated queues where a receive of this session ended with its outcome unknown: the
    /// session may hold deliveries there its client never got, to be returned before its next
    /// receive there (`Dispatch::release_lost`).
    answers_lost: HashSet<QueueName>,
    /// The open transaction of a transacted session.
    tx: Option<Transaction>,
}

/// The deliveries a heartbeat renews for one session, by queue.
pub(crate) type Held = Vec<(QueueName, Vec<(Seq, LeaseId)>)>;

/// The longest `client_id` a connection may give (it is shown in listings and logs).
pub(crate) const CLIENT_ID_BYTES_MAX: usize = 256;

/// The most acknowledgements one transaction holds until it commits (as many as the sends it
/// may stage in one queue, `ferry_kernel::STAGED_MAX`).
pub(crate) const TX_ACKS_MAX: usize = ferry_kernel::STAGED_MAX;

/// What a transacted session did since its last commit or rollback.
#[derive(Debug, Default, Clone)]
pub(crate) struct Transaction {
    /// The back-end every queue of the transaction lives on.
    pub(crate) node: Option<NodeId>,
    pub(crate) queues: BTreeSet<QueueName>,
    /// Acknowledgements held until commit.
    pub(crate) acks: Vec<String>,
    /// The run of the back-end that staged the transaction's first sends (0: none staged yet):
    /// the commit names it, so a back-end that restarted meanwhile (and lost them) refuses it.
    pub(crate) incarnation: u64,
}

/// What an administrator sees of a connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionSummary {
    pub(crate) id: String,
    pub(crate) client_id: String,
    pub(crate) sessions: usize,
    pub(crate) temporary_queues: usize,
    /// Until it is closed unless it heartbeats.
    pub(crate) lease_left: Duration,
    pub(crate) client_address: String,
    /// How long it has been open.
    pub(crate) open_for: Duration,
    /// Its sessions that received from or staged sends in queues, with those queues (where
    /// they may hold deliveries).
    pub(crate) session_queues: Vec<(SessionId, Vec<QueueName>)>,
}

/// What the back-ends must be told after a session or connection ended.
#[derive(Debug, Default)]
pub(crate) struct Closed {
    pub(crate) sessions: Vec<(SessionId, Vec<QueueName>)>,
    pub(crate) temporary_queues: Vec<QueueName>,
}

#[derive(Debug, Default)]
struct State {
    connections: HashMap<String, Connection>,
    sessions: HashMap<SessionId, Session>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Sessions {
    config: FrontendConfig,
    state: Mutex<State>,
    /// Connections and sessions are shown (listings, logs, temporary queue names) by their
    /// public form: their ids are what the calls acting on them carry.
    public: ferry_kernel::PublicIds,
}

impl State {
    fn session_mut(&mut self, id: SessionId) -> Result<&mut Session, Error> {
        self.sessions
            .get_mut(&id)
            .ok_or_else(|| Error::SessionNotFound { id: id.to_string() })
    }

    fn connection_mut(&mut self, id: &str) -> Result<&mut Connection, Error> {
        self.connections
            .get_mut(id)
            .ok_or_else(|| Error::ConnectionNotFound {
                id: ferry_kernel::shown(id),
            })
    }
}

impl Sessions {
    pub fn new(config: FrontendConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State::default()),
            public: ferry_kernel::PublicIds::new((rand::random(), rand::random())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a connection; returns its id and granted lease.
    pub(crate) fn open(
        &self,
        client_id: String,
        lease_ms: Option<u64>,
    ) -> Result<(String, u64), Error> {
        let c = &self.config;
        let lease_ms = lease_ms
            .unwrap_or(c.connection_lease_default_ms)
            .clamp(c.connection_lease_min_ms, c.connection_lease_max_ms);
        if client_id.len() > CLIENT_ID_BYTES_MAX {
            return Err(Error::LimitReached {
                what: format!("client_id is {} bytes", client_id.len()),
                limit: CLIENT_ID_BYTES_MAX,
                limit_name: "client_id_bytes_max",
            });
        }
        let mut s = self.lock();
        if s.connections.len() >= c.connections_max {
            return Err(Error::LimitReached {
                what: format!("{} connections are open", s.connections.len()),
                limit: c.connections_max,
                limit_name: "connections_max",
            });
        }
        let id = loop {
            let id = format!("c{:016x}", rand::random::<u64>());
            if !s.connections.contains_key(&id) {
                break id;
            }
        };
        let lease = Duration::from_millis(lease_ms);
        s.connections.insert(
            id.clone(),
            Connection {
                client_id,
                client_address: String::new(),
                opened: Instant::now(),
                lease,
                expires_at: Instant::now() + lease,
                sessions: BTreeSet::new(),
                temporary_queues: BTreeSet::new(),
                temporary_seq: 0,
            },
        );
        Ok((id, lease_ms))
    }

    /// Every open connection, by id.
    pub(crate) fn list(&self) -> Vec<ConnectionSummary> {
        let s = self.lock();
        let now = Instant::now();
        let mut all: Vec<_> = s
            .connections
            .iter()
            .map(|(id, c)| ConnectionSummary {
                id: self.public.connection(id),
                client_id: c.client_id.clone(),
                sessions: c.sessions.len(),
                temporary_queues: c.temporary_queues.len(),
                lease_left: c.expires_at.saturating_duration_since(now),
                client_address: c.client_address.clone(),
                open_for: now.saturating_duration_since(c.opened),
                session_queues: c
                    .sessions
                    .iter()
                    .filter_map(|sid| {
                        let sess = s.sessions.get(sid)?;
                        let mut queues: Vec<QueueName> = sess.queues.iter().cloned().collect();
                        queues.sort();
                        (!queues.is_empty()).then_some((*sid, queues))
                    })
                    .collect(),
            })
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Records where a connection's client connected from (shown in listings).
    pub(crate) fn set_client_address(&self, connection: &str, address: String) {
        if let Some(c) = self.lock().connections.get_mut(connection) {
            c.client_address = address;
        }
    }

    /// Open connections and sessions.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let s = self.lock();
        (s.connections.len(), s.sessions.len())
    }

    /// Renews a connection's lease; returns when it now runs out.
    pub(crate) fn touch(&self, connection: &str) -> Result<Instant, Error> {
        let mut s = self.lock();
        let c = s.connection_mut(connection)?;
        c.expires_at = Instant::now() + c.lease;
        Ok(c.expires_at)
    }

    pub(crate) fn create_session(
        &self,
        connection: &str,
        ack_mode: AckMode,
    ) -> Result<SessionId, Error> {
        let mut s = self.lock();
        if s.sessions.len() >= self.config.sessions_max {
            return Err(Error::LimitReached {
                what: format!("{} sessions are open on this node", s.sessions.len()),
                limit: self.config.sessions_max,
                limit_name: "sessions_max",
            });
        }
        let max = self.config.sessions_per_connection_max;
        let c = s.connection_mut(connection)?;
        if c.sessions.len() >= max {
            return Err(Error::LimitReached {
                what: format!(
                    "connection {} has {} sessions",
                    self.public.connection(connection),
                    c.sessions.len()
                ),
                limit: max,
                limit_name: "sessions_per_connection_max",
            });
        }
        c.expires_at = Instant::now() + c.lease;
        let id = loop {
            let id = SessionId(rand::random());
            if !s.sessions.contains_key(&id) {
                break id;
            }
        };
        if let Some(c) = s.connections.get_mut(connection) {
            c.sessions.insert(id);
        }
        s.sessions.insert(
            id,
            Session {
                connection: connection.into(),
                ack_mode,
                queues: HashSet::new(),
                held: HashMap::new(),
                answers_lost: HashSet::new(),
                tx: (ack_mode == AckMode::Transacted).then(Transaction::default),
            },
        );
        Ok(id)
    }

    /// Checks a session exists, renews its connection, and (when `queue` is given) remembers that
    /// the session may hold leases there. Returns the session's ack mode.
    pub(crate) fn use_session(
        &self,
        id: SessionId,
        queue: Option<&QueueName>,
    ) -> Result<AckMode, Error> {
        let mut s = self.lock();
        let sess = s.session_mut(id)?;
        if let Some(q) = queue {
            if !sess.queues.contains(q) {
                sess.queues.insert(q.clone());
            }
        }
        let (mode, conn) = (sess.ack_mode, sess.connection.clone());
        if let Some(c) = s.connections.get_mut(&conn) {
            c.expires_at = Instant::now() + c.lease;
        }
        Ok(mode)
    }

    /// A transacted session touches `queue` on `node` (a send or a receive). Fails if the
    /// transaction already lives on another back-end. Returns whether the session is transacted.
    pub(crate) fn tx_touch(
        &self,
        id: SessionId,
        queue: &QueueName,
        node: &NodeId,
    ) -> Result<bool, Error> {
        let mut s = self.lock();
        let sess = s.session_mut(id)?;
        let Some(tx) = sess.tx.as_mut() else {
            return Ok(false);
        };
        match &tx.node {
            Some(first) if first != node => {
                return Err(Error::TransactionSpansBackends {
                    session: id.to_string(),
                    first: first.clone(),
                    queue: queue.to_string(),
                    second: node.clone(),
                })
            }
            Some(_) => {}
            None => tx.node = Some(node.clone()),
        }
        tx.queues.insert(queue.clone());
        sess.queues.insert(queue.clone());
        Ok(true)
    }

    /// Holds acknowledgements of a transacted session until it commits. Returns false (and holds
    /// nothing) if the session is not transacted.
    /// At most [`TX_ACKS_MAX`] acknowledgements are held per transaction.
    pub(crate) fn tx_hold_acks(&self, id: SessionId, handles: &[String]) -> Result<bool, Error> {
        let mut s = self.lock();
        let sess = s.session_mut(id)?;
        let Some(tx) = sess.tx.as_mut() else {
            return Ok(false);
        };
        if tx.acks.len() + handles.len() > TX_ACKS_MAX {
            return Err(Error::LimitReached {
                what: format!(
                    "session {id} would hold {} acknowledgements in its transaction; commit more often",
                    tx.acks.len() + handles.len()
                ),
                limit: TX_ACKS_MAX,
                limit_name: "transaction_acks_max",
            });
        }
        tx.acks.extend(handles.iter().cloned());
        Ok(true)
    }

    /// Notes the back-end run that staged sends of the session's transaction. The first one
    /// stays: if a later send comes back from another run, the earlier sends are gone, and the
    /// commit naming the first run is refused.
    pub(crate) fn tx_staged_by(&self, id: SessionId, incarnation: u64) -> Result<(), Error> {
        let mut s = self.lock();
        if let Some(tx) = s.session_mut(id)?.tx.as_mut() {
            if tx.incarnation == 0 {
                tx.incarnation = incarnation;
            }
        }
        Ok(())
    }

    /// Ends a transacted session's transaction (for commit or rollback): returns what it did and
    /// starts a new, empty one.
    pub(crate) fn tx_take(&self, id: SessionId) -> Result<Transaction, Error> {
        let mut s = self.lock();
        let sess = s.session_mut(id)?;
        match sess.tx.as_mut() {
            Some(tx) => Ok(std::mem::take(tx)),
            None => Err(Error::NotTransacted { id: id.to_string() }),
        }
    }

    /// Puts back a transaction whose rollback could not reach its back-end, so a retried
    /// rollback (or the session's end) still undoes it there.
    pub(crate) fn tx_restore(&self, id: SessionId, tx: Transaction) {
        let mut s = self.lock();
        if let Some(cur) = s.sessions.get_mut(&id).and_then(|sess| sess.tx.as_mut()) {
            if cur.node.is_none() {
                cur.node = tx.node;
            }
            if cur.incarnation == 0 {
                cur.incarnation = tx.incarnation;
            }
            cur.queues.extend(tx.queues);
            cur.acks.extend(tx.acks);
        }
    }

    /// Whether a session is transacted.
    pub(crate) fn is_transacted(&self, id: SessionId) -> Result<bool, Error> {
        let s = self.lock();
        let sess = s
            .sessions
            .get(&id)
            .ok_or_else(|| Error::SessionNotFound { id: id.to_string() })?;
        Ok(sess.tx.is_some())
    }

    /// Deliveries passed on to a session's client (by their receipt handles): heartbeats renew
    /// them until they are settled. A session that has since closed records nothing.
    pub(crate) fn note_delivered<'a>(
        &self,
        id: SessionId,
        handles: impl IntoIterator<Item = &'a str>,
    ) {
        let mut s = self.lock();
        let Some(sess) = s.sessions.get_mut(&id) else {
            return;
        };
        for h in handles {
            // Handles come from the back-ends; one that does not parse cannot be renewed
            // (nor acknowledged): it runs out and is redelivered.
            if let Ok(r) = h.parse::<ReceiptHandle>() {
                sess.held.entry(r.queue).or_default().insert(r.seq, r.lease);
            }
        }
    }

    /// What a connection's heartbeat renews: per session, the deliveries passed on to its
    /// client and not yet found settled. Sessions holding nothing are left out.
    pub(crate) fn connection_held(
        &self,
        connection: &str,
    ) -> Result<Vec<(SessionId, Held)>, Error> {
        let s = self.lock();
        let c = s
            .connections
            .get(connection)
            .ok_or_else(|| Error::ConnectionNotFound {
                id: ferry_kernel::shown(connection),
            })?;
        Ok(c.sessions
            .iter()
            .filter_map(|id| {
                let held: Held = s
                    .sessions
                    .get(id)?
                    .held
                    .iter()
                    .filter(|(_, d)| !d.is_empty())
                    .map(|(q, d)| (q.clone(), d.iter().map(|(s, l)| (*s, *l)).collect()))
                    .collect();
                (!held.is_empty()).then_some((*id, held))
            })
            .collect())
    }

    /// Forgets deliveries a back-end says the session no longer holds (acknowledged, returned,
    /// expired, redelivered). A delivery of the same message made since keeps its place.
    pub(crate) fn forget_held(&self, id: SessionId, queue: &QueueName, gone: &[(Seq, LeaseId)]) {
        let mut s = self.lock();
        let Some(held) = s.sessions.get_mut(&id).map(|sess| &mut sess.held) else {
            return;
        };
        if let Some(d) = held.get_mut(queue) {
            for (seq, lease) in gone {
                if d.get(seq) == Some(lease) {
                    d.remove(seq);
                }
            }
            if d.is_empty() {
                held.remove(queue);
            }
        }
    }

    /// A receive of the session at `queue` ended with its outcome unknown (see
    /// [`Sessions::take_answer_lost`]). A session that has since closed records nothing.
    pub(crate) fn note_answer_lost(&self, id: SessionId, queue: &QueueName) {
        if let Some(sess) = self.lock().sessions.get_mut(&id) {
            sess.answers_lost.insert(queue.clone());
        }
    }

    /// If a receive of the session at `queue` lost its answer since the last call: forgets it
    /// and returns the deliveries there this front-end passed on to the client (what the
    /// back-end must keep leased). Taken once, so that of several receives about to start
    /// only one asks the back-end; [`Sessions::note_answer_lost`] again if that fails.
    pub(crate) fn take_answer_lost(
        &self,
        id: SessionId,
        queue: &QueueName,
    ) -> Option<Vec<(Seq, LeaseId)>> {
        let mut s = self.lock();
        let sess = s.sessions.get_mut(&id)?;
        if !sess.answers_lost.remove(queue) {
            return None;
        }
        let held = sess.held.get(queue).into_iter().flatten();
        Some(held.map(|(s, l)| (*s, *l)).collect())
    }

    /// How many deliveries a session's client holds, as far as this front-end knows.
    #[cfg(test)]
    pub(crate) fn held_count(&self, id: SessionId) -> usize {
        let s = self.lock();
        s.sessions
            .get(&id)
            .map_or(0, |sess| sess.held.values().map(HashMap::len).sum())
    }

    /// The queues where a session may hold leases.
    pub(crate) fn session_queues(&self, id: SessionId) -> Result<Vec<QueueName>, Error> {
        let s = self.lock();
        let sess = s
            .sessions
            .get(&id)
            .ok_or_else(|| Error::SessionNotFound { id: id.to_string() })?;
        Ok(sess.queues.iter().cloned().collect())
    }

    pub(crate) fn close_session(&self, id: SessionId) -> Result<Closed, Error> {
        let mut s = self.lock();
        let sess = s
            .sessions
            .remove(&id)
            .ok_or_else(|| Error::SessionNotFound { id: id.to_string() })?;
        if let Some(c) = s.connections.get_mut(&sess.connection) {
            c.sessions.remove(&id);
        }
        Ok(Closed {
            sessions: vec![(id, sess.queues.into_iter().collect())],
            temporary_queues: vec![],
        })
    }

    pub(crate) fn close_connection(&self, id: &str) -> Result<Closed, Error> {
        let mut s = self.lock();
        let c = s
            .connections
            .remove(id)
            .ok_or_else(|| Error::ConnectionNotFound {
                id: ferry_kernel::shown(id),
            })?;
        Ok(close_locked(&mut s, c))
    }

    /// Closes a connection an administrator names by its public form (as listings show it).
    pub(crate) fn close_connection_by_public(&self, public: &str) -> Result<Closed, Error> {
        let id = {
            let s = self.lock();
            s.connections
                .keys()
                .find(|id| self.public.connection(id) == public)
                .cloned()
        };
        self.close_connection(id.as_deref().unwrap_or(public))
    }

    /// What logs show of a session id.
    pub(crate) fn public_session(&self, id: SessionId) -> String {
        self.public.session(id)
    }

    /// Closes every connection whose lease ran out.
    pub(crate) fn close_expired(&self, now: Instant) -> Vec<(String, Closed)> {
        let mut s = self.lock();
        let expired: Vec<String> = s
            .connections
            .iter()
            .filter(|(_, c)| c.expires_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        expired
            .into_iter()
            .filter_map(|id| {
                let c = s.connections.remove(&id)?;
                tracing::info!(connection = %self.public.connection(&id), client_id = %ferry_kernel::shown(&c.client_id), "connection lease ran out; closing it");
                Some((id, close_locked(&mut s, c)))
            })
            .collect()
    }

    /// Names and records a new temporary queue for a connection.
    pub(crate) fn add_temporary_queue(
        &self,
        connection: &str,
        node: &ferry_kernel::NodeId,
    ) -> Result<QueueName, Error> {
        let mut s = self.lock();
        let on_node: usize = s
            .connections
            .values()
            .map(|c| c.temporary_queues.len())
            .sum();
        if on_node >= self.config.temporary_queues_max {
            return Err(Error::LimitReached {
                what: format!("{on_node} temporary queues are open on this node"),
                limit: self.config.temporary_queues_max,
                limit_name: "temporary_queues_max",
            });
        }
        let max = self.config.temporary_queues_per_connection_max;
        let c = s.connection_mut(connection)?;
        if c.temporary_queues.len() >= max {
            return Err(Error::LimitReached {
                what: format!(
                    "connection {} has {} temporary queues",
                    self.public.connection(connection),
                    c.temporary_queues.len()
                ),
                limit: max,
                limit_name: "temporary_queues_per_connection_max",
            });
        }
        c.temporary_seq += 1;
        // Named by the connection's public form: everyone who receives a request sees its
        // reply queue's name, and must not learn the connection id from it.
        let public = self.public.connection(connection);
        let name = QueueName::temporary(node, public, c.temporary_seq)?;
        c.temporary_queues.insert(name.clone());
        c.expires_at = Instant::now() + c.lease;
        Ok(name)
    }

    /// Forgets a temporary queue (it was not created, or it is being deleted).
    pub(crate) fn remove_temporary_queue(
        &self,
        connection: &str,
        queue: &QueueName,
    ) -> Result<(), Error> {
        let mut s = self.lock();
        let c = s.connection_mut(connection)?;
        if c.temporary_queues.remove(queue) {
            Ok(())
        } else {
            Err(Error::NotOwnTemporaryQueue {
                queue: queue.to_string(),
                connection: ferry_kernel::shown(connection),
            })
        }
    }
}

fn close_locked(s: &mut State, c: Connection) -> Closed {
    let sessions = c
        .sessions
        .iter()
        .filter_map(|id| {
            s.sessions
                .remove(id)
                .map(|sess| (*id, sess.queues.into_iter().collect()))
        })
        .collect();
    Closed {
        sessions,
        temporary_queues: c.temporary_queues.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited() -> Sessions {
        Sessions::new(FrontendConfig {
            sessions_max: 2,
            temporary_queues_max: 1,
            ..FrontendConfig::default()
        })
    }

    fn limit_name(e: Error) -> &'static str {
        match e {
            Error::LimitReached { limit_name, .. } => limit_name,
            other => panic!("expected a limit, got {other}"),
        }
    }

    // Postmortem: only per-connection limits existed, so many connections together could hold
    // connections_max × sessions_per_connection_max sessions (10^8 by default).
    #[test]
    fn node_wide_caps_hold_over_all_connections() {
        let s = limited();
        let node = NodeId::new("n").expect("a node id");
        let (a, _) = s.open("a".into(), None).expect("open");
        let (b, _) = s.open("b".into(), None).expect("open");
        s.create_session(&a, AckMode::Auto).expect("first");
        s.create_session(&b, AckMode::Auto).expect("second");
        let e = s
            .create_session(&b, AckMode::Auto)
            .expect_err("over sessions_max");
        assert_eq!(limit_name(e), "sessions_max");
        s.add_temporary_queue(&a, &node).expect("first");
        let e = s.add_temporary_queue(&b, &node).expect_err("over the cap");
        assert_eq!(limit_name(e), "temporary_queues_max");
    }

    fn handle(queue: &str, seq: u64, lease: u64) -> String {
        ReceiptHandle {
            queue: QueueName::new(queue).expect("a queue name"),
            uid: ferry_kernel::QueueUid(7),
            seq: Seq(seq),
            lease: LeaseId(lease),
            delivery_count: 1,
            tag: 9,
        }
        .to_string()
    }

    // Bug 3: heartbeats must name what was handed to the client, no more, and stop naming what
    // the back-end found settled, without dropping a newer delivery of the same message.
    #[test]
    fn heartbeats_name_the_deliveries_handed_over_until_a_back_end_finds_them_gone() {
        let s = limited();
        let (c, _) = s.open("c".into(), None).expect("open");
        let idle = s.create_session(&c, AckMode::Client).expect("a session");
        let busy = s.create_session(&c, AckMode::Client).expect("a session");
        let h = [handle("a", 1, 10), handle("a", 2, 11), handle("b", 1, 12)];
        s.note_delivered(busy, h.iter().map(String::as_str).chain(["not a handle"]));
        assert_eq!(s.held_count(busy), 3);
        assert_eq!(s.held_count(idle), 0);
        let mut held = s.connection_held(&c).expect("the connection");
        assert_eq!(held.len(), 1, "a session holding nothing is not renewed");
        let (sid, mut by_queue) = held.remove(0);
        assert_eq!(sid, busy);
        by_queue.sort_by(|x, y| x.0.cmp(&y.0));
        let a = QueueName::new("a").expect("a queue name");
        let mut in_a = by_queue[0].1.clone();
        in_a.sort();
        assert_eq!(in_a, vec![(Seq(1), LeaseId(10)), (Seq(2), LeaseId(11))]);
        // Message 1 of `a` was redelivered to the session meanwhile (lease 20): the back-end's
        // "lease 10 is gone" must not drop it.
        s.note_delivered(busy, [handle("a", 1, 20).as_str()]);
        s.forget_held(busy, &a, &[(Seq(1), LeaseId(10)), (Seq(2), LeaseId(11))]);
        assert_eq!(s.held_count(busy), 2);
        s.close_session(busy).expect("close");
        s.note_delivered(busy, [handle("a", 3, 30).as_str()]);
        assert!(s.connection_held(&c).expect("the connection").is_empty());
    }

    #[test]
    fn a_client_id_is_bounded_and_ids_never_show_in_listings_or_queue_names() {
        let s = limited();
        let e = s
            .open("x".repeat(CLIENT_ID_BYTES_MAX + 1), None)
            .expect_err("too long");
        assert_eq!(limit_name(e), "client_id_bytes_max");
        let (id, _) = s.open("ok".into(), None).expect("open");
        let listed = s.list();
        assert_eq!(listed.len(), 1);
        assert_ne!(listed[0].id, id);
        let tmp = s
            .add_temporary_queue(&id, &NodeId::new("n").expect("a node id"))
            .expect("a temporary queue");
        assert!(!tmp.as_str().contains(&id), "{tmp}");
        assert!(
            tmp.as_str().contains(&listed[0].id),
            "named by the public form: {tmp}"
        );
        // An administrator closes it by what the listing shows.
        assert!(s.close_connection_by_public(&listed[0].id).is_ok());
        assert!(s.touch(&id).is_err());
    }
}
