//! Thin wrappers over the few system calls the transports need (futex,
//! process_vm_readv, liveness). Every libc call goes through here.

use std::io;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, for at most `timeout`.
/// Returns early on a wake, a signal, or if the value already differs.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // Errors (EAGAIN, EINTR, ETIMEDOUT) all mean "go and look again".
    // SAFETY: `word` is a valid, aligned atomic in a mapping the caller keeps
    // alive; the timespec is a valid relative timeout; FUTEX_WAIT ignores the
    // unused arguments.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread sleeping on `word`.
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE only reads the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Reads `len` bytes at address `remote` of process `pid` into `local`
/// (cross-memory attach). Loops over short reads.
///
/// # Safety
/// `local` must be valid for writes of `len` bytes.
pub(crate) unsafe fn process_read(
    pid: i32,
    remote: u64,
    local: *mut u8,
    len: usize,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            // SAFETY: done < len and the caller guarantees local..local+len.
            iov_base: unsafe { local.add(done) } as *mut libc::c_void,
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: both iovecs describe valid ranges (the remote one is checked
        // by the kernel, which returns EFAULT for bad addresses).
        let n = unsafe { libc::process_vm_readv(pid, &l, 1, &r, 1, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv read 0 bytes",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether this process can read a peer process's memory with
/// `process_vm_readv` (cross-memory attach), as online tuning's direct-read
/// twin needs ([`crate::tune::Choice::cma`]): Yama's `ptrace_scope` is
/// absent or 0 (1 and above let a process read only its descendants, and
/// ranks are siblings), and a read of this process's own memory works
/// (a seccomp filter, as some containers install, makes the call fail).
pub(crate) fn cma_usable() -> bool {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(s) if s.trim() != "0" => return false,
        _ => {}
    }
    let src = [0x5au8; 16];
    let mut dst = [0u8; 16];
    // SAFETY: `src` is this process's own memory and `dst` holds 16 bytes.
    let r = unsafe { process_read(pid(), src.as_ptr() as u64, dst.as_mut_ptr(), 16) };
    r.is_ok() && dst == src
}

/// This process's real user id.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// This process's PID namespace (the target of `/proc/self/ns/pid`, e.g.
/// `pid:[4026531836]`); empty where it cannot be read. Ranks whose
/// namespaces differ see each other's pids as other processes, or none.
pub(crate) fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// True if process `pid` exists and has not exited (a zombie, which its
/// parent has not reaped yet, counts as dead).
pub(crate) fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    let exists = r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    // /proc/PID/stat: "pid (comm) S ..."; the state follows the last ')'.
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(b) => {
            let after = b
                .iter()
                .rposition(|&c| c == b')')
                .map_or(&b[..], |i| &b[i + 1..]);
            let state = after.iter().find(|c| !c.is_ascii_whitespace()).copied();
            !matches!(state, Some(b'Z') | Some(b'X') | Some(b'x'))
        }
        Err(_) => exists,
    }
}

/// Waits until one of `fds` is readable (or closed), for at most `timeout`.
pub(crate) fn wait_readable(fds: &[std::os::fd::RawFd], timeout: Duration) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` is a valid array of pollfd for the duration of the call;
    // errors (EINTR) only end the wait early.
    unsafe {
        libc::poll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            timeout.as_millis().max(1) as i32,
        )
    };
}

/// Sleeps until one of `fds` is ready as asked, or at most `timeout` (a
/// `ppoll()`, so that a timeout under a millisecond stays that short).
pub(crate) fn ppoll(fds: &mut [libc::pollfd], timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a valid array of pollfd and `ts` a valid timespec
    // for the duration of the call; no signal mask is passed. Errors
    // (EINTR) only end the wait early.
    unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        );
    }
}

/// What the kernel says of a TCP socket's unacknowledged bytes: segments
/// sent and not yet acknowledged, how many retransmission timeouts in a
/// row have fired for them (reset by any acknowledgement), the
/// milliseconds since the last acknowledgement arrived, and the current
/// retransmission timeout (milliseconds). `None` if the
/// socket cannot tell (not TCP, closed).
pub(crate) fn tcp_unacked(fd: std::os::fd::RawFd) -> Option<TcpUnacked> {
    // SAFETY: tcp_info is plain old data; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is
    // that large, and sets `len` to what it wrote.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(TcpUnacked {
        segments: info.tcpi_unacked,
        timeouts: info.tcpi_retransmits,
        since_ack_ms: info.tcpi_last_ack_recv,
        rto_ms: info.tcpi_rto / 1000,
    })
}

/// See [`tcp_unacked`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct TcpUnacked {
    pub segments: u32,
    pub timeouts: u8,
    pub since_ack_ms: u32,
    pub rto_ms: u32,
}

pub(crate) use crate::topo::online_cpus;

/// This process's id.
pub(crate) fn pid() -> i32 {
    std::process::id() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cross-memory attach is usable exactly where Yama lets a process read
    /// its siblings (no Yama, or `ptrace_scope` 0); this machine installs
    /// no seccomp filter that would block the call.
    #[test]
    fn cma_usable_follows_ptrace_scope() {
        let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
        let open = scope.as_deref().is_none_or(|s| s.trim() == "0");
        assert_eq!(cma_usable(), open, "ptrace_scope {scope:?}");
    }
}
