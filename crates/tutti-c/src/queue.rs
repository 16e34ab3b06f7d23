//! `tuttiQueue_t`: the CPU counterpart of a CUDA stream. A queue is a
//! thread that runs the operations put on it one after another, in the
//! order they were put; the caller goes on at once. `tuttiQueueSynchronize`
//! waits for everything put so far, `tuttiQueueQuery` polls.
//!
//! Every operation has the deadline of its communicator, so a queue never
//! waits forever: a stuck operation fails with `tuttiTimeout` and the next
//! one starts.

use crate::handle::{fail_local, guard, Failure};
use crate::*;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

/// A job: it reports its own errors (on its communicator).
pub(crate) type Job = Box<dyn FnOnce() -> Result<(), Failure> + Send>;

/// What the queue's thread and its users share.
#[derive(Default)]
struct State {
    /// Jobs put and not yet finished.
    pending: usize,
    /// The first error since the last synchronize.
    error: Option<(tuttiResult_t, String)>,
}

/// A queue of operations (opaque).
pub struct tuttiQueue {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    state: Arc<(Mutex<State>, Condvar)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The handle of a queue; NULL in a data call means "block until done".
pub type tuttiQueue_t = *mut tuttiQueue;

impl tuttiQueue {
    /// Puts `job` at the end of the queue.
    pub(crate) fn put(&self, job: Job) -> Result<(), Failure> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else {
            return Err(Failure::arg("the queue is being destroyed"));
        };
        let (m, _) = &*self.state;
        m.lock().unwrap_or_else(|e| e.into_inner()).pending += 1;
        if tx.send(job).is_err() {
            m.lock().unwrap_or_else(|e| e.into_inner()).pending -= 1;
            return Err(Failure {
                code: tuttiInternalError,
                msg: "the queue's thread is gone".into(),
            });
        }
        Ok(())
    }

    fn wait_idle(&self) -> Option<(tuttiResult_t, String)> {
        let (m, cv) = &*self.state;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        while s.pending > 0 {
            s = cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.error.take()
    }
}

fn worker(rx: mpsc::Receiver<Job>, state: Arc<(Mutex<State>, Condvar)>) {
    for job in rx {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).unwrap_or_else(|_| {
            Err(Failure {
                code: tuttiInternalError,
                msg: "internal error: an operation on a queue panicked".into(),
            })
        });
        let (m, cv) = &*state;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(f) = r {
            s.error.get_or_insert((f.code, f.msg));
        }
        s.pending -= 1;
        cv.notify_all();
    }
}

/// A live queue behind `q`.
///
/// # Safety
/// `q` must be a handle from [`tuttiQueueCreate`] not yet destroyed.
pub(crate) unsafe fn queue_ref<'a>(q: tuttiQueue_t) -> &'a tuttiQueue {
    // SAFETY: the caller's promise.
    unsafe { &*q }
}

/// Makes a new queue in `*queue`.
///
/// # Safety
/// `queue` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tuttiQueueCreate(queue: *mut tuttiQueue_t) -> tuttiResult_t {
    const CALL: &str = "tuttiQueueCreate";
    guard(CALL, None, || {
        if queue.is_null() {
            return Err(Failure::arg(format!("{CALL}: queue is NULL")));
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let state = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name("tutti-queue".into())
            .spawn(move || worker(rx, st))
            .map_err(|e| Failure {
                code: tuttiSystemError,
                msg: format!("{CALL}: starting the queue's thread: {e}"),
            })?;
        let q = Box::new(tuttiQueue {
            tx: Mutex::new(Some(tx)),
            state,
            thread: Mutex::new(Some(thread)),
        });
        // SAFETY: checked non-null; the caller promises it is writable.
        unsafe { queue.write(Box::into_raw(q)) };
        Ok(())
    })
}

/// Waits until every operation put on `queue` so far has finished. Returns
/// the first error among them since the last synchronize (its text is the
/// thread's last error), else [`tuttiSuccess`].
///
/// # Safety
/// `queue` must be a live queue.
#[no_mangle]
pub unsafe extern "C" fn tuttiQueueSynchronize(queue: tuttiQueue_t) -> tuttiResult_t {
    const CALL: &str = "tuttiQueueSynchronize";
    if queue.is_null() {
        return fail_local("tuttiQueueSynchronize: queue is NULL");
    }
    // SAFETY: the caller's promise.
    let q = unsafe { queue_ref(queue) };
    guard(CALL, None, || match q.wait_idle() {
        None => Ok(()),
        Some((code, msg)) => Err(Failure { code, msg }),
    })
}

/// [`tuttiSuccess`] if every operation put on `queue` has finished (then
/// as [`tuttiQueueSynchronize`]: the first error if one failed),
/// [`tuttiInProgress`] if some are still running. Does not wait.
///
/// # Safety
/// `queue` must be a live queue.
#[no_mangle]
pub unsafe extern "C" fn tuttiQueueQuery(queue: tuttiQueue_t) -> tuttiResult_t {
    if queue.is_null() {
        return fail_local("tuttiQueueQuery: queue is NULL");
    }
    // SAFETY: the caller's promise.
    let q = unsafe { queue_ref(queue) };
    let busy = {
        let (m, _) = &*q.state;
        m.lock().unwrap_or_else(|e| e.into_inner()).pending > 0
    };
    if busy {
        return tuttiInProgress;
    }
    // SAFETY: as above.
    unsafe { tuttiQueueSynchronize(queue) }
}

/// Waits for `queue`'s operations, then ends its thread and frees it.
///
/// # Safety
/// `queue` must be a live queue, used by no other call during or after
/// this one.
#[no_mangle]
pub unsafe extern "C" fn tuttiQueueDestroy(queue: tuttiQueue_t) -> tuttiResult_t {
    if queue.is_null() {
        return fail_local("tuttiQueueDestroy: queue is NULL");
    }
    // SAFETY: the caller's promise: a live queue from Box::into_raw, not
    // used again.
    let q = unsafe { Box::from_raw(queue) };
    guard("tuttiQueueDestroy", None, move || {
        q.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = q.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        Ok(())
    })
}
