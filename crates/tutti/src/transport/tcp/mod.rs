//! The TCP transport.
//!
//! # Lanes and frames
//!
//! A link to a peer is `K` connected sockets, its *lanes* (`K` is chosen at
//! set-up by the rank that dials, see [`Framing`]). With one lane, a message
//! is its 16-byte [`Header`] and its payload. With several, a message of `L`
//! bytes is cut on a fixed grid into frames of `chunk` bytes (the last one
//! shorter); each frame is the message's header (collective sequence
//! number, tag, the message's number on the link, and the total length
//! `L`), the frame's offset in the message (8 bytes), and its payload. A
//! message of at most one chunk is one frame and always travels on lane 0,
//! so that it pays no extra latency (the receiver waits on one socket); a
//! larger one is spread over every lane.
//!
//! Frames are given to lanes as they become free: the sender hands the next
//! frame to the next lane (in turn) that is not still busy writing one, so a
//! lane that runs slower (a congested path, an unlucky hash) carries fewer
//! frames instead of holding up the whole message, as a fixed stripe would.
//! `TCP_NOTSENT_LOWAT` keeps each lane's unsent queue short, so that "busy"
//! means what it says. The receiver reads a frame's offset from its header,
//! puts the payload there, and keeps a bitmap of the frames it has, which
//! says when the message is complete and how long its complete prefix is (a
//! fused step forwards that prefix).
//!
//! Every frame header is checked against what the receiver expects, so a
//! frame of another op, another length or another message number on any
//! lane is an [`Error::Mismatch`]; so is an offset off the grid, beyond the
//! message, or seen twice. One exception: on a link with several lanes, a
//! frame of a *later* message may arrive on one lane while the current
//! message still has frames in flight on another (the sender moved on after
//! writing them, and later messages may have gone entirely on other lanes);
//! that header is kept, the lane pauses, and the header is checked when its
//! message's turn comes.
//!
//! A liveness probe ([`NOP`]) may appear between frames on any lane and is
//! skipped by the receiver.
//!
//! A link of one lane also takes messages of *variable length* (the
//! point-to-point channel's frames,
//! [`RecvMsg::var_len`](crate::transport::RecvMsg::var_len)): the receive
//! names the most it takes, and the header says how long the message is
//! (longer is a mismatch). Not knowing where such a message ends, the
//! header read asks for up to [`lanes::READ_AHEAD`] bytes past the header;
//! what it takes of the messages after stays in the lane's buffer as their
//! beginning.
//!
//! A send call writes at most [`lanes::TX_BURST`] payload bytes per lane,
//! so that a thread that both sends and receives reads between bursts.
//!
//! # Who does the system calls
//!
//! [`TcpLink`] moves frames with non-blocking reads and writes on the
//! executor's thread (the *inline* mode). Payloads are read straight into
//! the destination buffer; a reducing receive reads into the bounce buffer
//! and reduces whole elements, carrying a partial element (per lane) over to
//! the next read. The lane machinery ([`Lanes`]) is shared with the I/O
//! thread mode in [`io`], where a dedicated thread does the
//! system calls.
//!
//! # Files
//!
//! * `framing.rs`: how messages are cut into frames ([`Framing`]) and how
//!   a receiver checks them;
//! * `lanes.rs`: the sockets of a link and the frame machinery over them
//!   ([`Lanes`]), used by both modes, and the graceful close;
//! * `link.rs`: [`TcpLink`], the inline mode's link;
//! * `io/`: the I/O thread mode ([`IoSet`], its thread, [`IoLink`]);
//! * `connect.rs`: set-up: socket options, the hello, dialling and
//!   accepting a rank's peers, the frame size, congestion control, and
//!   whether the links get an I/O thread.

pub(crate) mod connect;
mod framing;
pub(crate) mod io;
mod lanes;
mod link;
#[cfg(test)]
mod tests;

pub(crate) use framing::{Framing, DEFAULT_CHUNK, MAX_LANES, NOP};
pub(crate) use io::{IoLink, IoSet};
pub(crate) use lanes::{close_gracefully, Lanes};
pub(crate) use link::TcpLink;
