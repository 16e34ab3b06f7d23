//! Shared-memory rings: the `shm` transport (processes on one host) and, over
//! a heap segment instead of a shared file, the `local` transport (threads of
//! one process).
//!
//! # Segment layout
//!
//! One segment per host (or per process for `local`) holds, for L local
//! ranks:
//!
//! ```text
//! [ SegHeader | Doorbell x L | RingCtl x C*L*L | ring data x C*L*L (cap bytes
//!   each) | mailbox slots x L*16 ]
//! ```
//!
//! The mailboxes carry small collectives in one shot (see
//! [`mailbox`]); the rings carry everything else, on
//! [`CHANNELS`] independent channels: channel 0 for collectives (in issue
//! order), channel [`P2P_CHANNEL`] for point-to-point messages, so that a
//! send or receive never waits behind a collective's bytes or the reverse.
//!
//! Ring (c, i, j) carries bytes of channel c from local rank i to local
//! rank j. Its
//! `RingCtl` holds three cache-padded counters: `head` (bytes ever written,
//! stored only by i), `tail` (bytes ever consumed, stored only by j) and
//! `acked` (direct-read messages j has finished, stored only by j).
//!
//! # Messages
//!
//! Every message starts with a 16-byte [`Header`]; its payload follows and is
//! padded to 16 bytes, so every message starts 16-aligned and no element
//! straddles the ring's wrap point. A large message whose bytes are all ready
//! is sent *direct*: the header is followed by the sender's pid and buffer
//! address, the receiver copies (or reduces) straight from the sender's
//! memory — `memcpy` for threads, `process_vm_readv` for processes — and
//! bumps `acked`. Each byte then crosses memory once instead of twice.
//! Before reading, the receiver claims the message (`claim`); a sender that
//! fails first withdraws it instead, so a buffer is never read after its
//! owner has given up on the op (and may have freed it).
//!
//! A copied message moves in pieces of an eighth of the ring: the sender
//! publishes `head` after each piece it writes and the receiver `tail`
//! after each piece it takes, so the two copy at the same time.
//!
//! # Waiting
//!
//! A rank with nothing to do spins briefly, then sleeps on the futex in its
//! [`Doorbell`]. Whoever changes a counter the sleeper may be waiting for
//! calls [`notify`]: a SeqCst fence, then a wake only if the doorbell says
//! somebody sleeps. The sleeper announces itself, re-checks its work, and
//! only then sleeps on the sequence number it read, so no wake-up is lost.
//!
//! # Files
//!
//! * `segment.rs`: the segment ([`Segment`], [`Layout`]) and the
//!   [`Doorbell`]s, with [`notify`] and [`sleep_on`];
//! * `link.rs`: [`RingLink`], one peer's pair of rings on one channel (the
//!   [`Link`](super::Link) of this transport);
//! * `mailbox.rs`: the mailboxes of small collectives;
//! * `connect.rs`: set-up: the shared file (create, name, open, unlink)
//!   and the links of a host's ranks.

pub(crate) mod connect;
pub(crate) mod failure;
mod link;
pub(crate) mod mailbox;
mod segment;

pub(crate) use link::{DirectRead, RingLink};
pub(crate) use segment::{
    abort_wake, notify, notify_fenced, sleep_on, Doorbell, Layout, Segment, P2P_CHANNEL,
};
