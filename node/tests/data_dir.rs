//! Data directories written by earlier releases, upgraded at the first start, resumably: two
//! databases (the Raft engine's own in `raft/`) become one, with a crash at every step between.

use std::path::Path;

use ferry_kernel::{QueueConfig, QueueName, QueueUid};
use ferry_multiraft::{Engine, EngineConfig, GroupId, LogStore, NodeId, Recovered};
use ferry_node::config::Config;
use ferry_node::data_dir::{open_store, DATABASE_DIR, OLD_RAFT_DIR};
use ferry_node::raft::IMPORT_MARKER;
use ferry_store::{KvSpace, QueueDef, QueueStore, RocksStore, StoreOp};

/// What the Raft engine's database of an earlier release held, key by key.
struct OldRaft {
    records: Vec<(Vec<u8>, Vec<u8>)>,
    app: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Writes the layout of the release before one database per node: the queue database with one
/// queue, and the Raft engine's own database with group 0 bootstrapped and an application key.
fn write_two_databases(data_dir: &Path) -> OldRaft {
    let queues = RocksStore::open(&data_dir.join(DATABASE_DIR)).expect("queue database");
    let def = QueueDef {
        name: QueueName::new("orders").expect("name"),
        uid: QueueUid(42),
        replica: None,
        config: QueueConfig::default(),
    };
    queues
        .write(&[vec![StoreOp::PutQueue(def)]])
        .expect("queue written");
    drop(queues);
    let mut old = ferry_multiraft::RocksStore::open(&data_dir.join(OLD_RAFT_DIR)).expect("raft db");
    let mut engine =
        Engine::open(EngineConfig::new(NodeId(7)), Recovered::default()).expect("engine");
    engine
        .bootstrap_group(GroupId(0), &[NodeId(7)])
        .expect("bootstrap");
    let mut job = engine.round().persist.expect("a bootstrap writes");
    job.put_app(b"meta/state".to_vec(), b"the metadata".to_vec());
    job.put_app(b"node/raft_id".to_vec(), 7u64.to_be_bytes().to_vec());
    old.write(&job).expect("raft job written");
    let records = raw_scan(&old_records(&data_dir.join(OLD_RAFT_DIR)), "raft");
    let app = old.app_scan(b"").expect("app keys");
    OldRaft { records, app }
}

fn old_records(dir: &Path) -> rocksdb::DB {
    rocksdb::DB::open_cf_for_read_only(
        &rocksdb::Options::default(),
        dir,
        ["raft", "raft_app"],
        false,
    )
    .expect("old raft database opens")
}

fn raw_scan(db: &rocksdb::DB, cf: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let cf = db.cf_handle(cf).expect("column family");
    db.iterator_cf(cf, rocksdb::IteratorMode::Start)
        .map(|kv| {
            let (k, v) = kv.expect("readable");
            (k.into_vec(), v.into_vec())
        })
        .collect()
}

fn config(data_dir: &Path) -> Config {
    Config {
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    }
}

/// The node's database holds exactly the old Raft records, and the queue is still there.
fn assert_absorbed(store: &dyn QueueStore, old: &OldRaft) {
    assert_eq!(
        store.kv_scan(KvSpace::RaftLog, b"").expect("raft records"),
        old.records
    );
    assert_eq!(
        store.kv_scan(KvSpace::RaftApp, b"").expect("app keys"),
        old.app
    );
    let queues = store.recover().expect("recover");
    assert_eq!(queues.len(), 1);
    assert_eq!(queues[0].def.name.as_str(), "orders");
}

#[test]
fn two_databases_become_one_at_the_first_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = write_two_databases(dir.path());
    assert!(!old.records.is_empty() && old.app.len() == 2);
    let store = open_store(&config(dir.path())).expect("opens");
    assert_absorbed(store.as_ref(), &old);
    assert!(
        !dir.path().join(OLD_RAFT_DIR).exists(),
        "old database removed"
    );
    drop(store);
    // And again: nothing left to do, nothing changed.
    let store = open_store(&config(dir.path())).expect("reopens");
    assert_absorbed(store.as_ref(), &old);
}

/// A crash after the synced copy, before the old directory was removed: the next start only
/// removes it (copying again would be harmless here, but must not be needed).
#[test]
fn a_crash_after_the_copy_only_removes_the_old_database_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = write_two_databases(dir.path());
    let store = RocksStore::open(&dir.path().join(DATABASE_DIR)).expect("opens");
    let copied = store
        .absorb_raft_database(&dir.path().join(OLD_RAFT_DIR))
        .expect("copied");
    assert!(
        matches!(copied, ferry_store::Absorbed::Copied { keys } if keys as usize == old.records.len() + old.app.len())
    );
    drop(store); // the crash
                 // A second copy would take this key too (or refuse to start): the old database must not be
                 // read again.
    let cfs = ["raft", "raft_app"];
    let db = rocksdb::DB::open_cf(
        &rocksdb::Options::default(),
        dir.path().join(OLD_RAFT_DIR),
        cfs,
    )
    .expect("old database opens");
    db.put_cf(db.cf_handle("raft").expect("cf"), b"late", b"write")
        .expect("written");
    drop(db);
    let store = open_store(&config(dir.path())).expect("restarts");
    assert_absorbed(store.as_ref(), &old);
    assert!(!dir.path().join(OLD_RAFT_DIR).exists());
}

/// A crash in the middle of removing the old directory leaves a part of it, no longer a
/// database: the next start removes the rest.
#[test]
fn a_crash_while_removing_the_old_database_is_finished_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = write_two_databases(dir.path());
    let store = RocksStore::open(&dir.path().join(DATABASE_DIR)).expect("opens");
    store
        .absorb_raft_database(&dir.path().join(OLD_RAFT_DIR))
        .expect("copied");
    drop(store);
    std::fs::remove_file(dir.path().join(OLD_RAFT_DIR).join("CURRENT")).expect("half removed");
    let store = open_store(&config(dir.path())).expect("restarts");
    assert_absorbed(store.as_ref(), &old);
    assert!(!dir.path().join(OLD_RAFT_DIR).exists());
}

/// An import of a single-node directory's queues that the earlier release left unfinished goes
/// on: its marker moves from the old Raft directory to the data directory.
#[test]
fn an_unfinished_import_goes_on_after_the_upgrade() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_two_databases(dir.path());
    std::fs::write(dir.path().join(OLD_RAFT_DIR).join(IMPORT_MARKER), b"x").expect("marker");
    drop(open_store(&config(dir.path())).expect("opens"));
    assert!(dir.path().join(IMPORT_MARKER).exists());
}

/// Raft state in both databases (a directory put back by hand from two backups, say) is not
/// merged or chosen between: the node refuses to start and says what to do, removing nothing.
#[test]
fn raft_state_in_both_databases_is_refused_and_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = write_two_databases(dir.path());
    let store = RocksStore::open(&dir.path().join(DATABASE_DIR)).expect("opens");
    store
        .write(&[vec![StoreOp::Kv(ferry_store::KvOp::Put {
            space: KvSpace::RaftLog,
            key: b"someone else's".to_vec(),
            value: b"record".to_vec(),
        })]])
        .expect("written");
    drop(store);
    let error = open_store(&config(dir.path())).expect_err("refused");
    let text = format!("{error:#}");
    assert!(text.contains("both the node's database and"), "{text}");
    assert_eq!(
        raw_scan(&old_records(&dir.path().join(OLD_RAFT_DIR)), "raft"),
        old.records
    );
}
