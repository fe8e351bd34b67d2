//! A small disk under producers that never stop: the disk guard must refuse sends before the disk
//! fills, so the store never fails a write, the node stays SERVING, and every confirmed message
//! can still be received and acknowledged (acknowledgements write too).
//!
//! Needs root (it mounts a tmpfs of its own, and unmounts it however the test ends).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, Node, NodeOptions};

/// A tmpfs of `size_mib` mounted on a directory of its own; unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mib: u32) -> anyhow::Result<Tmpfs> {
        let parent = tempfile::tempdir()?;
        let dir = parent.path().join("small-disk");
        std::fs::create_dir(&dir)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&dir)
            .status()?;
        anyhow::ensure!(
            status.success(),
            "mounting a tmpfs failed ({status}): this test needs root"
        );
        Ok(Tmpfs {
            dir,
            _parent: parent,
        })
    }

    fn free_bytes(&self) -> anyhow::Result<u64> {
        free_bytes(&self.dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a server killed a moment ago may still hold files for an instant.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A node on `disk` with no disk guard (the disk is let fill, as another process on it would
/// fill it), its log in `logs`: off the disk that fills, so that the node can say why it stopped.
fn start_unguarded(disk: &Tmpfs, logs: &Path) -> anyhow::Result<Node> {
    Node::start(
        &disk.dir.join("data"),
        NodeOptions {
            env: vec![("FERRY_DISK_FREE_MIN_BYTES".into(), "0".into())],
            log_dir: Some(logs.to_owned()),
            ..Default::default()
        },
    )
}

/// Waits (at most 20 s) for `node` to stop by itself, and checks that its exit status says
/// it failed.
async fn stops_by_itself(node: &mut Node) -> anyhow::Result<()> {
    let mut status = None;
    ferry_integration_tests::wait_until(
        std::time::Duration::from_secs(20),
        "the node to stop",
        || {
            status = status.or_else(|| node.exited());
            std::future::ready(Ok(status.is_some()))
        },
    )
    .await?;
    let status = status.expect("waited for");
    assert!(
        !status.success(),
        "a node that stopped by itself says so: {status}"
    );
    Ok(())
}

fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()?;
    let text = String::from_utf8(out.stdout)?;
    Ok(text
        .lines()
        .nth(1)
        .unwrap_or_default()
        .trim()
        .parse::<u64>()?)
}

// Postmortem: the guard judged each send on a reading up to 500 ms old, so producers filled a
// 200 MiB file system past the limit (2 of 7 runs); then acknowledgements and queue creation failed
// too, and the node still said SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_cannot_fill_the_disk_past_the_guard_and_acks_keep_working() -> anyhow::Result<()>
{
    const DISK_MIB: u32 = 64;
    const FREE_MIN_BYTES: u64 = 24 * 1024 * 1024;
    let disk = Tmpfs::mount(DISK_MIB)?;
    let mut node = Node::start(
        &disk.dir.join("data"),
        NodeOptions {
            env: vec![(
                "FERRY_DISK_FREE_MIN_BYTES".into(),
                FREE_MIN_BYTES.to_string(),
            )],
            ..Default::default()
        },
    )?;
    let client = node.client().await?;
    create_queue(&client, "fill").await?;
    let conn = client.open_connection("producers").await?;
    // Four producers, each keeping 8 sends of 64 KiB in flight, until the guard refuses.
    let mut producers = vec![];
    for p in 0..4 {
        let session = conn.create_session(AckMode::Auto).await?;
        producers.push(tokio::spawn(async move {
            let mut confirmed = 0u64;
            // Bounded: 96 MiB cannot take 10 000 messages of 64 KiB.
            for _ in 0..10_000 / 8 {
                let window: Vec<_> = (0..8)
                    .map(|_| session.send_async("fill", vec![Message::bytes(vec![p; 64 * 1024])]))
                    .collect();
                let mut refused = None;
                for w in window {
                    match w.await {
                        Ok(_) => confirmed += 1,
                        Err(e) => refused = Some(e),
                    }
                }
                if let Some(e) = refused {
                    return (confirmed, Some(e));
                }
            }
            (confirmed, None)
        }));
    }
    let mut confirmed = 0;
    for p in producers {
        let (n, refused) = p.await?;
        confirmed += n;
        let e = refused.expect("the guard refused before 10 000 messages");
        assert_eq!(e.code(), Some(tonic::Code::ResourceExhausted), "{e}");
        assert!(e.to_string().contains("disk_free_min_bytes"), "{e}");
    }
    assert!(confirmed > 50, "some sends went through: {confirmed}");
    let free = disk.free_bytes()?;
    assert!(
        free > 0,
        "the disk filled up: {free} bytes free after {confirmed} sends"
    );
    // The store never failed a write: the node is SERVING (Node::client checks health) and
    // every confirmed message comes back and is acknowledged.
    let client = node.client().await?;
    let conn = client.open_connection("consumer").await?;
    let session = conn.create_session(AckMode::Individual).await?;
    let mut received = 0;
    loop {
        let got = session
            .receive("fill", ReceiveOptions::no_wait().max(100))
            .await?;
        if got.is_empty() {
            break;
        }
        received += got.len() as u64;
        session.ack(&got).await?;
    }
    assert_eq!(received, confirmed);
    // And it starts again on this disk.
    node.restart()?;
    let client = node.client().await?;
    create_queue(&client, "after-restart").await?;
    Ok(())
}

// Postmortem: after a failed write the store refuses every write until a restart, and the node
// still answered SERVING to health checks, so nothing routed around it. Then: it answered
// NOT_SERVING, until its next Raft write (a queue created, say) met the same store and stopped
// it. Now it stops at once, whichever write failed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_failed_a_write_stops_the_node_which_starts_again_once_space_is_freed(
) -> anyhow::Result<()> {
    let disk = Tmpfs::mount(64)?;
    let logs = tempfile::tempdir()?;
    let mut node = start_unguarded(&disk, logs.path())?;
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    let conn = client.open_connection("p").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let kept = session.send("q", vec![Message::text("before")]).await?;
    // Another process fills the disk.
    let filler = disk.dir.join("filler");
    let filled = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=1024"])
        .arg(format!("of={}", filler.display()))
        .output()?;
    assert!(!filled.status.success(), "dd stops at a full disk");
    // Sends fail until one reaches the store and poisons it (bounded).
    let mut failed = None;
    for _ in 0..1_000 {
        if let Err(e) = session
            .send("q", vec![Message::bytes(vec![1; 256 * 1024])])
            .await
        {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("a send on a full disk fails");
    assert!(
        matches!(
            e.code(),
            Some(tonic::Code::ResourceExhausted | tonic::Code::Unavailable)
        ),
        "the failed write, or the node stopping after it: {e}"
    );
    stops_by_itself(&mut node).await?;
    let log = node.log();
    assert!(
        log.contains("takes no more until the node restarts")
            && log.contains("its store failed a write")
            && log.contains("free space on the disk"),
        "the log says what happened and what to do"
    );
    // Recovery, as documented: free space, restart.
    std::fs::remove_file(&filler)?;
    node.restart()?;
    let client = node.client().await?;
    let conn = client.open_connection("c").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let got = session
        .receive("q", ReceiveOptions::no_wait().max(1_000))
        .await?;
    assert!(
        got.iter().any(|r| r.message_id() == kept[0]),
        "confirmed before the disk filled"
    );
    Ok(())
}

/// The same end when the first write to fail is a Raft round's (a queue created on the full
/// disk): the metadata group halts, and the node says it is the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_write_on_a_full_disk_stops_the_node_naming_the_store() -> anyhow::Result<()> {
    let disk = Tmpfs::mount(64)?;
    let logs = tempfile::tempdir()?;
    let mut node = start_unguarded(&disk, logs.path())?;
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    let filler = disk.dir.join("filler");
    let filled = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=1024"])
        .arg(format!("of={}", filler.display()))
        .output()?;
    assert!(!filled.status.success(), "dd stops at a full disk");
    // Creates fail once a round's write meets the full disk (bounded: each adds entries).
    let mut refused = false;
    for i in 0..200 {
        if create_queue(&client, &format!("q{i}")).await.is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "a create on a full disk fails");
    stops_by_itself(&mut node).await?;
    assert!(
        node.log().contains("its store failed a write"),
        "the log names the store, not only the metadata group"
    );
    std::fs::remove_file(&filler)?;
    node.restart()?;
    let client = node.client().await?;
    create_queue(&client, "after").await?;
    Ok(())
}
