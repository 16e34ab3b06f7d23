//! The control frames of the point-to-point protocol.
//!
//! Each direction of a pair's point-to-point link carries, in order, 32-byte
//! control frames, each a transport message of its own (an inline eager
//! message's payload rides in the same message, behind its frame:
//! [`super::eager`]); a `Data` frame is followed by one more message, the
//! payload. A message moves in three
//! frames (rendezvous), so that a payload only ever travels into a buffer
//! its receiver has already matched, and a link never holds bytes that
//! nobody will take:
//!
//! ```text
//!   sender                          receiver
//!     | -- Offer {id, tag, len} -->   |   (queued until a receive matches)
//!     | <-- Clear {id} -------------  |   (matched, the buffer fits)
//!     | -- Data {id, len} + payload ->|
//! ```
//!
//! `Refuse {id, aux = buffer bytes}` answers an offer that does not fit the
//! receive that matched it (both sides fail, nothing moves); `Cancel {id}`
//! answers a `Clear` for a send that has already failed (its deadline ran
//! out), so that the receiver fails too instead of waiting. An empty
//! message is done once its offer is sent and matched.
//!
//! A small message may instead travel eager ([`super::eager`]): `Eager {id,
//! tag, len}` and its payload at once (the send completes once they have
//! left); the receiver gives the credit of the eager bytes its receives
//! took back in bulk, `Ack {len}` per 64 KiB, or per message once the
//! sender, closing, has said `Flush`.

use crate::error::{Error, Result};

/// Bytes of a control frame.
pub(super) const CTRL_BYTES: usize = 32;

/// What a control frame says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// The sender offers message `id` of `len` bytes with `tag`.
    Offer,
    /// The receiver matched offer `id`: send the payload.
    Clear,
    /// The receiver matched offer `id` with a receive of `aux` bytes, which
    /// the message does not fit.
    Refuse,
    /// Message `id`'s payload (`len` bytes) follows as the next message.
    Data,
    /// The sender gave up on message `id` after it was cleared.
    Cancel,
    /// Eager message `id` of `len` bytes with `tag`; its payload follows
    /// as the next message.
    Eager,
    /// Receives took (or refused) `len` bytes of eager messages: their
    /// credit comes back.
    Ack,
    /// The sender is closing: give eager credit back at once from now on
    /// (an `Ack` per message taken), so that it knows when its messages
    /// have all been taken.
    Flush,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Offer,
        Kind::Clear,
        Kind::Refuse,
        Kind::Data,
        Kind::Cancel,
        Kind::Eager,
        Kind::Ack,
        Kind::Flush,
    ];
}

/// A control frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ctrl {
    pub kind: Kind,
    /// The user's tag (offers, eager messages).
    pub tag: u32,
    /// The message's number among the sender's messages to this peer.
    pub id: u64,
    /// Payload bytes (offers, data, eager messages).
    pub len: u64,
    /// Refuse: the receive buffer's bytes.
    pub aux: u64,
}

/// On the wire: kind (u32), tag (u32), id, len, aux (u64 each), little endian.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Raw {
    kind: u32,
    tag: u32,
    id: u64,
    len: u64,
    aux: u64,
}

const _: () = assert!(std::mem::size_of::<Raw>() == CTRL_BYTES);

impl Ctrl {
    /// A frame of `kind` about message `id`.
    pub fn new(kind: Kind, id: u64) -> Ctrl {
        Ctrl {
            kind,
            tag: 0,
            id,
            len: 0,
            aux: 0,
        }
    }

    /// The frame's bytes.
    pub fn encode(&self) -> [u8; CTRL_BYTES] {
        let kind = Kind::ALL
            .iter()
            .position(|&k| k == self.kind)
            .expect("every kind is listed") as u32
            + 1;
        let raw = Raw {
            kind: kind.to_le(),
            tag: self.tag.to_le(),
            id: self.id.to_le(),
            len: self.len.to_le(),
            aux: self.aux.to_le(),
        };
        let mut b = [0u8; CTRL_BYTES];
        b.copy_from_slice(bytemuck::bytes_of(&raw));
        b
    }

    /// Decodes a frame from `peer`; a malformed one is a protocol error.
    pub fn decode(b: &[u8; CTRL_BYTES], rank: usize, peer: usize) -> Result<Ctrl> {
        let raw: Raw = bytemuck::pod_read_unaligned(b);
        let k = u32::from_le(raw.kind) as usize;
        let kind = k
            .checked_sub(1)
            .and_then(|i| Kind::ALL.get(i))
            .copied()
            .ok_or_else(|| Error::Mismatch {
                rank,
                peer,
                seq: 0,
                msg: format!(
                    "a point-to-point control frame of unknown kind {k} arrived from rank {peer} \
                     (corrupted data, or a peer of another tutti version)"
                ),
            })?;
        Ok(Ctrl {
            kind,
            tag: u32::from_le(raw.tag),
            id: u64::from_le(raw.id),
            len: u64::from_le(raw.len),
            aux: u64::from_le(raw.aux),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        for kind in Kind::ALL {
            let c = Ctrl {
                kind,
                tag: 0xdead_beef,
                id: 7,
                len: 1 << 40,
                aux: 3,
            };
            assert_eq!(Ctrl::decode(&c.encode(), 0, 1).unwrap(), c);
        }
    }

    #[test]
    fn unknown_kinds_are_errors() {
        let mut b = Ctrl::new(Kind::Offer, 1).encode();
        for k in [0u32, 9, u32::MAX] {
            b[..4].copy_from_slice(&k.to_le_bytes());
            let e = Ctrl::decode(&b, 0, 1).unwrap_err().to_string();
            assert!(e.contains("unknown kind"), "{e}");
        }
    }
}
