//! Network partitions between cluster nodes on one machine, with iptables (root needed).
//!
//! Every node runs on its own loopback address, but the kernel gives every connection *to* a
//! loopback address the source 127.0.0.1, whoever opens it: a rule `-s A -d B` would never see
//! node A's own connections. So each node runs in a cgroup of its own (v2), and a rule in the
//! `nat` table rewrites the source of whatever it sends on `lo` to its address (SNAT). Then a
//! partition of node N from node O is, in the `filter` table's INPUT:
//!
//! - `-s N -d O -j DROP` and `-s O -d N -j DROP`: the packets of connections each opened;
//! - `-m conntrack --ctreplsrc N --ctrepldst O --ctdir REPLY -j DROP` and the same with N and O
//!   swapped: the answers on the connections the other opened, whose destination the kernel
//!   turned back into 127.0.0.1 before INPUT sees them.
//!
//! A one-way cut (N's packets to O dropped, O's to N not) is the first rule of each pair.
//!
//! Every rule lives in chains of the run's own (`FERRY-CHAOS-<pid>`, one in `filter` jumped to
//! from INPUT, one in `nat` jumped to from POSTROUTING): [`Firewall`]'s drop unhooks, flushes and
//! deletes both and removes the cgroups, even when the run panics.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context};

/// The iptables chains and cgroups of one run. Dropping it removes them all (kill the nodes in
/// them first: a cgroup with a process in it cannot be removed).
#[derive(Debug)]
pub struct Firewall {
    chain: String,
    /// The cgroups made, as (absolute directory, path relative to the cgroup2 root).
    cgroups: Vec<(PathBuf, String)>,
    cgroup_root: PathBuf,
    /// The hooks (table, built-in chain) that jump to our chains, to unhook on drop.
    hooks: Vec<(&'static str, &'static str)>,
    /// Some partition rule is in place.
    cut: AtomicBool,
}

/// Runs `iptables -w ARGS`; fails with its error output.
fn iptables(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running iptables")?;
    if !out.status.success() {
        bail!(
            "iptables {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Where the cgroup2 hierarchy is mounted (from /proc/self/mounts).
fn cgroup2_root() -> anyhow::Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(dir))
        })
        .next()
        .context("no cgroup2 file system is mounted: partitions need one (and root)")
}

impl Firewall {
    /// Checks that iptables runs and cgroup2 is mounted, and makes the run's empty chains.
    pub fn new() -> anyhow::Result<Firewall> {
        let probe = Command::new("iptables")
            .args(["-w", "-S", "INPUT"])
            .stdin(Stdio::null())
            .output();
        match probe {
            Err(e) => bail!(
                "the cluster scenarios cut the network with iptables, which did not run ({e}): \
                 install it (apt-get install iptables) and run as root"
            ),
            Ok(o) if !o.status.success() => bail!(
                "the cluster scenarios cut the network with iptables, which failed: {} \
                 (run as root, with CAP_NET_ADMIN)",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Ok(_) => {}
        }
        let mut fw = Firewall {
            chain: format!("FERRY-CHAOS-{}", std::process::id()),
            cgroups: vec![],
            cgroup_root: cgroup2_root()?,
            hooks: vec![],
            cut: AtomicBool::new(false),
        };
        for (table, hook) in [("filter", "INPUT"), ("nat", "POSTROUTING")] {
            iptables(&["-t", table, "-N", &fw.chain])?;
            // Recorded first: the drop removes the chain even if the hook fails.
            fw.hooks.push((table, hook));
            iptables(&["-t", table, "-I", hook, "-j", &fw.chain])?;
        }
        Ok(fw)
    }

    /// Makes the cgroup of node `name` and rewrites the source of what it sends on loopback to
    /// `ip`; returns the cgroup's `cgroup.procs`, for the node to join before it starts.
    pub fn add_node(&mut self, name: &str, ip: &str) -> anyhow::Result<PathBuf> {
        let relative = format!("{}-{name}", self.chain.to_lowercase());
        let dir = self.cgroup_root.join(&relative);
        std::fs::create_dir(&dir).with_context(|| format!("making cgroup {}", dir.display()))?;
        self.cgroups.push((dir.clone(), relative.clone()));
        iptables(&[
            "-t",
            "nat",
            "-A",
            &self.chain,
            "-o",
            "lo",
            "-m",
            "cgroup",
            "--path",
            &relative,
            "-j",
            "SNAT",
            "--to-source",
            ip,
        ])?;
        Ok(dir.join("cgroup.procs"))
    }

    /// Cuts `ip` from each of `others`, both ways, until [`Firewall::heal`].
    pub fn partition(&self, ip: &str, others: &[String]) -> anyhow::Result<()> {
        self.cut.store(true, Ordering::SeqCst);
        for o in others {
            self.drop_sent(ip, o)?;
            self.drop_sent(o, ip)?;
        }
        Ok(())
    }

    /// Drops every packet `ip` sends to each of `others`, on connections either side opened,
    /// until [`Firewall::heal`]; what they send to it still arrives. (Over TCP the side still
    /// heard gets no acknowledgement back: its connections stall and retransmit, rather than
    /// fail.)
    pub fn cut_one_way(&self, ip: &str, others: &[String]) -> anyhow::Result<()> {
        self.cut.store(true, Ordering::SeqCst);
        for o in others {
            self.drop_sent(ip, o)?;
        }
        Ok(())
    }

    /// Drops what `from` sends to `to`: on connections `from` opened, its packets, addressed from
    /// it; on connections `to` opened, the replies `from` sends on them (matched by their reply
    /// tuple, as the kernel has already turned them back toward 127.0.0.1).
    fn drop_sent(&self, from: &str, to: &str) -> anyhow::Result<()> {
        iptables(&["-A", &self.chain, "-s", from, "-d", to, "-j", "DROP"])?;
        iptables(&[
            "-A",
            &self.chain,
            "-m",
            "conntrack",
            "--ctreplsrc",
            from,
            "--ctrepldst",
            to,
            "--ctdir",
            "REPLY",
            "-j",
            "DROP",
        ])
    }

    /// Ends every partition; whether there was one.
    pub fn heal(&self) -> anyhow::Result<bool> {
        iptables(&["-F", &self.chain])?;
        Ok(self.cut.swap(false, Ordering::SeqCst))
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        for (table, hook) in self.hooks.drain(..) {
            // Bounded: the hook was inserted once; a second delete fails and ends the loop.
            for _ in 0..4 {
                if iptables(&["-t", table, "-D", hook, "-j", &self.chain]).is_err() {
                    break;
                }
            }
            let flushed = iptables(&["-t", table, "-F", &self.chain])
                .and_then(|()| iptables(&["-t", table, "-X", &self.chain]));
            if let Err(e) = flushed {
                eprintln!("chaos: could not remove iptables chain: {e:#}");
            }
        }
        for (dir, _) in self.cgroups.drain(..) {
            if let Err(e) = std::fs::remove_dir(&dir) {
                eprintln!("chaos: could not remove cgroup {}: {e}", dir.display());
            }
        }
    }
}
