//! Why a rank failed, as its doorbell tells the ranks on its host.
//!
//! A failing rank sets its doorbell's `aborted` word, and its peers, seeing
//! it, fail with [`Error::PeerLost`] instead of waiting out their own
//! timeout. The word carries a code, so that their error says what the
//! failed rank saw: "rank 0 lost peer rank 2 ...: rank 2 timed out waiting
//! for rank 1" names the rank at the root of it, where "failed or was
//! aborted" would leave the user to find it. The low 8 bits are the reason,
//! the rest the rank it names, plus one (0: none).

use crate::error::Error;

const FAILED: u32 = 1;
const ABORTED: u32 = 2;
const TIMED_OUT: u32 = 3;
const LOST_PEER: u32 = 4;
const MISMATCH: u32 = 5;

/// The doorbell code of a rank that failed with `e` (never 0).
pub(crate) fn code(e: &Error) -> u32 {
    let (reason, names) = match e {
        Error::Aborted => (ABORTED, None),
        Error::Timeout { waiting_for, .. } => (TIMED_OUT, waiting_for.first().copied()),
        Error::PeerLost { peer, .. } => (LOST_PEER, Some(*peer)),
        Error::Mismatch { peer, .. } => (MISMATCH, Some(*peer)),
        _ => (FAILED, None),
    };
    // A rank beyond 24 bits is not named (the reason still is).
    let names = names
        .and_then(|r| u32::try_from(r + 1).ok())
        .filter(|&r| r < 1 << 24);
    reason | names.unwrap_or(0) << 8
}

/// What rank `q`'s doorbell code says, for a peer's error message.
pub(crate) fn describe(q: usize, code: u32) -> String {
    let names = (code >> 8).checked_sub(1);
    match (code & 0xff, names) {
        (ABORTED, _) => format!("rank {q} was aborted"),
        (TIMED_OUT, Some(w)) => format!("rank {q} timed out waiting for rank {w}"),
        (TIMED_OUT, None) => format!("rank {q} timed out"),
        (LOST_PEER, Some(p)) => format!("rank {q} lost peer rank {p}"),
        (MISMATCH, Some(p)) => {
            format!("rank {q} failed: its call did not match rank {p}'s (collective mismatch)")
        }
        _ => format!("rank {q} failed or was aborted"),
    }
}

#[cfg(test)]
mod tests {
    use super::{code, describe};
    use crate::error::Error;

    #[test]
    fn codes_name_the_cause() {
        let t = Error::Timeout {
            rank: 2,
            op: "all_gather".into(),
            seq: 5,
            after: std::time::Duration::from_secs(3),
            waiting_for: vec![1, 3],
        };
        assert_eq!(describe(2, code(&t)), "rank 2 timed out waiting for rank 1");
        let lost = Error::PeerLost {
            rank: 0,
            peer: 7,
            op: "send".into(),
            seq: 1,
            msg: String::new(),
        };
        assert_eq!(describe(0, code(&lost)), "rank 0 lost peer rank 7");
        assert_eq!(describe(4, code(&Error::Aborted)), "rank 4 was aborted");
        let other = Error::Internal("x".into());
        assert_eq!(describe(1, code(&other)), "rank 1 failed or was aborted");
        assert_ne!(code(&other), 0);
        // Unknown codes (a newer peer) still read as a failure.
        assert_eq!(describe(1, 0xff), "rank 1 failed or was aborted");
    }
}
