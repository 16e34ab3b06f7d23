//! Set-up of the shm transport: the shared file and the links of a host's
//! ranks.
//!
//! The host's lowest rank creates the segment in `/dev/shm` under a fresh
//! name ([`create`]), the bootstrap hands the name to the host's other
//! ranks, which map it ([`open`]), and once all have, the creator removes
//! the file ([`Created::unlink`]): nothing is left behind even if the job
//! is killed, and a failed set-up leaves nothing either. Every rank then
//! makes a [`RingLink`] per local peer and channel ([`ring_links`]).

use super::segment::CHANNELS;
use super::{DirectRead, Layout, RingLink, Segment};
use crate::error::{Error, Result};
use crate::transport::{sys, Exchange, Link};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// A segment this rank created. Its file is removed when this is dropped
/// or [unlinked](Created::unlink), whichever comes first.
pub(crate) struct Created {
    seg: Arc<Segment>,
    /// The name the host's other ranks open it by.
    pub(crate) name: String,
    _unlink: Unlink,
}

impl Created {
    /// Every rank of the host has mapped the segment: removes its file and
    /// keeps the mapping.
    pub(crate) fn unlink(self) -> Arc<Segment> {
        self.seg
    }
}

/// Removes a shared-memory file when dropped, so that a failed set-up
/// leaves nothing in /dev/shm.
struct Unlink(String);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn shm_path(name: &str) -> String {
    format!("/dev/shm{name}")
}

/// Creates and maps a fresh segment of `layout`, named after the job's
/// `token`, this process, the creator's index `me` in the set-up exchange
/// and a random suffix.
pub(crate) fn create(token: &[u8; 16], me: usize, layout: Layout) -> Result<Created> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut suffix = [0u8; 4];
    getrandom::getrandom(&mut suffix).expect("the OS random source failed");
    let name = format!(
        "/tutti-{}-{}-{}-{}",
        hex(&token[..4]),
        sys::pid(),
        me,
        hex(&suffix)
    );
    let path = shm_path(&name);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io(format!("creating {path}"), e))?;
    let unlink = Unlink(path);
    let path = &unlink.0;
    f.set_len(layout.total as u64).map_err(|e| {
        Error::io(
            format!(
                "sizing {path} to {} bytes (is /dev/shm big enough?)",
                layout.total
            ),
            e,
        )
    })?;
    let seg = Segment::map(f.as_raw_fd(), layout, true)?;
    Ok(Created {
        seg,
        name,
        _unlink: unlink,
    })
}

/// Maps the segment another rank of this host [created](create) as `name`.
pub(crate) fn open(name: &str, layout: Layout) -> Result<Arc<Segment>> {
    let path = shm_path(name);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("opening {path}"), e))?;
    Segment::map(f.as_raw_fd(), layout, false)
}

/// Puts in `links` (indexed by rank) this rank's links on channel `chan`
/// of `seg` to the ranks `locals` (the rank of each local index; this
/// rank's local index is `me`, which gets none).
pub(crate) fn ring_links(
    seg: &Arc<Segment>,
    chan: usize,
    me: usize,
    locals: &[usize],
    direct: DirectRead,
    links: &mut [Option<Link>],
) {
    for (li, &q) in locals.iter().enumerate() {
        if li != me {
            links[q] = Some(Link::Ring(RingLink::on_channel(
                seg.clone(),
                chan,
                me,
                li,
                direct,
            )));
        }
    }
}

/// This rank's place among the ranks of its host, for [`wire`].
pub(crate) struct HostRanks<'a> {
    /// The group rank of each local index.
    pub locals: &'a [usize],
    /// This rank's local index.
    pub me: usize,
    /// The host's lowest rank's index in the set-up exchange (it creates
    /// the segment).
    pub leader: usize,
    /// This rank's index in the set-up exchange.
    pub exchange_me: usize,
}

/// The shm transport's set-up rounds (every rank of the group takes part,
/// `enabled` or not, so that the rounds stay in step): the host's lowest
/// rank creates the segment and names it; the others map it; once all have,
/// its file is removed; then every rank puts its ring links on each
/// channel into `chans` (indexed by group rank: the collectives' links and
/// the point-to-point channel's). Returns the mapped segment, if enabled.
/// `boot` turns a set-up failure into the caller's error.
pub(crate) fn wire(
    ex: &mut dyn Exchange,
    enabled: bool,
    host: &HostRanks<'_>,
    token: &[u8; 16],
    ring_bytes: usize,
    chans: [&mut Vec<Option<Link>>; CHANNELS],
    boot: &dyn Fn(String) -> Error,
) -> Result<Option<Arc<Segment>>> {
    let layout = Layout::new(host.locals.len().max(1), ring_bytes);
    let mut created = None;
    let name_out = if enabled && host.me == 0 {
        let c = create(token, host.exchange_me, layout).map_err(|e| boot(e.to_string()))?;
        let name = c.name.clone().into_bytes();
        created = Some(c);
        name
    } else {
        Vec::new()
    };
    let names = ex.allgather(&name_out)?;
    if !enabled {
        ex.barrier()?;
        return Ok(None);
    }
    let seg = match created.take() {
        Some(c) => {
            let r = ex.barrier(); // everybody has mapped it
            let seg = c.unlink(); // removes the file, on success or failure
            r?;
            seg
        }
        None => {
            let name = String::from_utf8(names[host.leader].clone())
                .map_err(|_| boot("bad segment name".into()))?;
            let seg = open(&name, layout).map_err(|e| boot(e.to_string()))?;
            ex.barrier()?;
            seg
        }
    };
    for (chan, links) in chans.into_iter().enumerate() {
        ring_links(
            &seg,
            chan,
            host.me,
            host.locals,
            DirectRead::Cma,
            &mut links[..],
        );
    }
    Ok(Some(seg))
}
