//! The recovery listener, as the engine keeps it: every rank keeps the
//! listener it connected through for [`shrink`](crate::Communicator::shrink),
//! whose survivors meet on it after a failure, and for liveness probes
//! ([`dead_ranks`](crate::Communicator::dead_ranks)) that connect and drop.
//! A healthy communicator drains it between ops so that its queue never
//! fills.

use super::Core;
use std::time::Duration;

/// How often a busy communicator drains its recovery listener. A probe
/// waits in the listener's queue (and counts as an answer) until then; the
/// queue holds far more than one probe per rank per drain.
pub(super) const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// Hands the core a handle on the recovery listener (so it can drain it)
/// and gives the listener a long queue.
pub(crate) fn keep_rescue(core: &mut Core, l: Option<&std::net::TcpListener>) {
    if let Some(l) = l {
        let _ = socket2::SockRef::from(l).listen(4096);
        let _ = l.set_nonblocking(true);
        core.rescue = l.try_clone().ok();
    }
}

/// Accepts and drops whatever waits on a recovery listener (other ranks'
/// liveness probes, strangers), so its queue never fills and a live rank
/// never looks dead. Only a healthy communicator drains (between ops): a
/// failed one keeps its queue for the survivors' recovery store.
pub(super) fn drain(l: &std::net::TcpListener) {
    if l.set_nonblocking(true).is_ok() {
        for _ in 0..4096 {
            if l.accept().is_err() {
                break;
            }
        }
    }
}
