//! Communicator handles, result codes and the last-error text.
//!
//! A `tuttiComm_t` is an `Arc<tuttiComm>` turned into a raw pointer: the
//! handle's own reference, which only `tuttiCommDestroy` releases. A call
//! borrows the communicator through the handle without touching the
//! count, as NCCL's rule makes that safe: a communicator is never
//! destroyed while another call on it runs. An op that outlives its call
//! (on a queue, in a group) takes a reference of its own, so a destroy
//! with ops still queued frees nothing they use. `tuttiCommAbort`
//! releases nothing (it only fails the waiting and later ops), which is
//! what makes it safe from any thread while calls run.

use crate::*;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use tutti::{Collective, Communicator, DataType, Error, Options, RawCall, ReduceOp};

/// A communicator (opaque): one rank's membership of a group.
pub struct tuttiComm {
    pub(crate) comm: Communicator,
    /// Per-call options from the config (algorithm, deadline), without
    /// its wire type.
    pub(crate) opts: Options,
    /// `opts` with the config's 16-bit wire (`tuttiConfig_t::wireType`),
    /// for the calls it applies to ([`tuttiComm::opts_for`]).
    wire: Option<Options>,
    /// The last error of a call on this communicator.
    last: Mutex<String>,
    /// The first error of an operation that ran on a queue, for
    /// `tuttiCommGetAsyncError`.
    pub(crate) async_err: Mutex<Option<tuttiResult_t>>,
}

/// The handle of a communicator.
pub type tuttiComm_t = *mut tuttiComm;

impl tuttiComm {
    /// Wraps `comm` into a new handle.
    pub(crate) fn into_handle(comm: Communicator, opts: Options) -> tuttiComm_t {
        let c = Arc::new(tuttiComm {
            comm,
            opts: Options { wire: None, ..opts },
            wire: opts.wire.map(|_| opts),
            last: Mutex::new(String::new()),
            async_err: Mutex::new(None),
        });
        Arc::into_raw(c) as tuttiComm_t
    }

    /// The options of this communicator's config, its wire included (what
    /// a split or a shrink without a config of its own inherits).
    pub(crate) fn config_opts(&self) -> Options {
        self.wire.unwrap_or(self.opts)
    }

    /// The options `call` runs with: with the config's wire type for a
    /// float32 sum or average AllReduce, ReduceScatter or Reduce (the
    /// calls a 16-bit wire applies to: gradients), else without it, so one
    /// communicator carries both its gradients on the wire and its other
    /// calls (integers, Broadcast, a max) as they are.
    #[inline(always)]
    pub(crate) fn opts_for(&self, call: &RawCall) -> &Options {
        match &self.wire {
            Some(w)
                if call.dtype == DataType::F32
                    && matches!(call.op, ReduceOp::Sum | ReduceOp::Avg)
                    && matches!(
                        call.coll,
                        Collective::AllReduce
                            | Collective::ReduceScatter
                            | Collective::Reduce { .. }
                    ) =>
            {
                w
            }
            _ => &self.opts,
        }
    }

    /// Records `msg` as this communicator's (and this thread's) last error.
    pub(crate) fn record(&self, msg: &str) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = msg.to_owned();
        set_thread_error(msg);
    }

    /// Records an error of an op that ran on a queue.
    pub(crate) fn record_async(&self, code: tuttiResult_t, msg: &str) {
        self.record(msg);
        self.async_err
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(code);
    }

    /// `rank R of N`, for messages.
    pub(crate) fn who(&self) -> String {
        format!("rank {} of {}", self.comm.rank(), self.comm.size())
    }
}

/// The communicator behind `h`, borrowed for the duration of a call (the
/// count is not touched: never drop the result, clone it for an op that
/// outlives the call), or an error text.
///
/// # Safety
/// `h` must be NULL or a handle returned by this library and not yet
/// destroyed, and no `tuttiCommDestroy` of it may run until the borrow
/// ends (NCCL's rule; `tuttiCommAbort` releases nothing).
#[inline(always)]
pub(crate) unsafe fn comm_ref(
    h: tuttiComm_t,
    call: &str,
) -> Result<ManuallyDrop<Arc<tuttiComm>>, String> {
    if h.is_null() {
        return Err(format!("{call}: comm is NULL"));
    }
    // SAFETY: the caller promises `h` came from `Arc::into_raw` and that
    // the handle's reference is held until this borrow ends; the
    // `ManuallyDrop` never gives that reference back.
    Ok(ManuallyDrop::new(unsafe {
        Arc::from_raw(h as *const tuttiComm)
    }))
}

thread_local! {
    /// This thread's last error, and the text `tuttiGetLastError` handed out.
    static LAST: RefCell<(String, CString)> = RefCell::new((String::new(), CString::default()));
}

pub(crate) fn set_thread_error(msg: &str) {
    LAST.with(|l| l.borrow_mut().0 = msg.to_owned());
}

/// Records `msg` as this thread's last error: [`tuttiInvalidArgument`].
pub(crate) fn fail_local(msg: &str) -> tuttiResult_t {
    set_thread_error(msg);
    tuttiInvalidArgument
}

/// The code of a Rust error.
pub(crate) fn code_of(e: &Error) -> tuttiResult_t {
    match e {
        Error::InvalidArgument(_) => tuttiInvalidArgument,
        Error::Config(_) | Error::Mismatch { .. } | Error::SizeMismatch { .. } => tuttiInvalidUsage,
        Error::Bootstrap { .. } | Error::Io { .. } => tuttiSystemError,
        Error::Timeout { .. } => tuttiTimeout,
        Error::PeerLost { .. } => tuttiRemoteError,
        Error::Aborted => tuttiAborted,
        _ => tuttiInternalError,
    }
}

/// An error of a call: its code and full text.
pub(crate) struct Failure {
    pub(crate) code: tuttiResult_t,
    pub(crate) msg: String,
}

impl Failure {
    /// An invalid argument.
    pub(crate) fn arg(msg: impl Into<String>) -> Self {
        Failure {
            code: tuttiInvalidArgument,
            msg: msg.into(),
        }
    }

    /// A Rust error of `call` on `c`.
    #[cold]
    pub(crate) fn of(c: &tuttiComm, call: &str, e: &Error) -> Self {
        Failure {
            code: code_of(e),
            msg: format!("{}: {call}: {e}", c.who()),
        }
    }
}

/// Runs `f` with panics caught: a panic is [`tuttiInternalError`]. A
/// failure is recorded on `comm` (if any) and on this thread.
#[inline(always)]
pub(crate) fn guard(
    name: &str,
    comm: Option<&tuttiComm>,
    f: impl FnOnce() -> Result<(), Failure>,
) -> tuttiResult_t {
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Failure {
            code: tuttiInternalError,
            msg: format!("{name}: internal error (a panic, caught): {what}"),
        })
    });
    match r {
        Ok(()) => tuttiSuccess,
        Err(f) => failed(comm, f),
    }
}

/// Records a failure on `comm` (if any) and on this thread; its code.
#[cold]
#[inline(never)]
fn failed(comm: Option<&tuttiComm>, f: Failure) -> tuttiResult_t {
    match comm {
        Some(c) => c.record(&f.msg),
        None => set_thread_error(&f.msg),
    }
    f.code
}

/// Runs `f` on the communicator behind `h` with panics caught.
///
/// # Safety
/// As for [`comm_ref`].
#[inline(always)]
pub(crate) unsafe fn with_comm(
    name: &str,
    h: tuttiComm_t,
    f: impl FnOnce(&Arc<tuttiComm>) -> Result<(), Failure>,
) -> tuttiResult_t {
    // SAFETY: the caller's promise.
    let c = match unsafe { comm_ref(h, name) } {
        Ok(c) => c,
        Err(msg) => return fail_local(&msg),
    };
    guard(name, Some(&c), || f(&c))
}

/// The text of a result code (a static string).
#[no_mangle]
pub extern "C" fn tuttiGetErrorString(result: tuttiResult_t) -> *const c_char {
    let s: &'static CStr = match result {
        tuttiSuccess => c"no error",
        tuttiSystemError => c"system error (an OS call, a socket or shared memory failed)",
        tuttiInternalError => c"internal error (a bug in tutti)",
        tuttiInvalidArgument => c"invalid argument",
        tuttiInvalidUsage => {
            c"invalid usage (mismatched calls across ranks or a bad configuration)"
        }
        tuttiRemoteError => c"remote error (a peer died or its connection broke)",
        tuttiInProgress => c"operation in progress",
        tuttiTimeout => c"timeout (an operation missed its deadline)",
        tuttiAborted => c"communicator aborted",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// The full text of the last error: of the last failed call on `comm`, or
/// of the last failed call on this thread if `comm` is NULL. It names the
/// rank, the call and the peer. The text stays valid until this thread's
/// next call of `tuttiGetLastError`; it is empty if nothing failed.
///
/// # Safety
/// `comm` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn tuttiGetLastError(comm: tuttiComm_t) -> *const c_char {
    let text = if comm.is_null() {
        LAST.with(|l| l.borrow().0.clone())
    } else {
        // SAFETY: the caller's promise; `comm` is not NULL.
        match unsafe { comm_ref(comm, "tuttiGetLastError") } {
            Ok(c) => c.last.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            Err(m) => m,
        }
    };
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        l.1 = c;
        l.1.as_ptr()
    })
}
