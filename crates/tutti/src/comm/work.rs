//! [`Work`]: the handle of an asynchronous op.

use crate::engine::Completion;
use crate::error::Result;
use std::sync::Arc;
use std::time::Duration;

/// The handle of an asynchronous op, owning the op's buffers until it completes.
///
/// Ops complete in the order they were issued. [`wait`](Work::wait) returns
/// the buffers with the results. Dropping a `Work` without waiting blocks
/// until the op is done (the buffers must outlive the op); forgetting it
/// (`mem::forget`) leaks the buffers rather than freeing memory in use.
#[must_use = "an op's results are only available through wait()"]
pub struct Work<B = ()> {
    pub(crate) done: Arc<Completion>,
    pub(crate) buf: Option<B>,
}

impl<B> Work<B> {
    pub(crate) fn new(done: Arc<Completion>, buf: B) -> Self {
        Work {
            done,
            buf: Some(buf),
        }
    }

    /// Waits for the op and returns its buffers, or its error.
    pub fn wait(mut self) -> Result<B> {
        let r = self
            .done
            .wait(None)
            .expect("waiting without a deadline returns a result");
        let b = self.buf.take().expect("buffers are present until wait");
        r.map(|_| b)
    }

    /// Waits up to `timeout`: `None` if the op is still running, else its
    /// outcome (then [`wait`](Work::wait) returns at once).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<()>> {
        self.done.wait(Some(timeout))
    }

    /// True once the op has completed (successfully or not).
    pub fn is_done(&self) -> bool {
        self.done.is_done()
    }
}

impl<B> Drop for Work<B> {
    fn drop(&mut self) {
        if self.buf.is_some() {
            let _ = self.done.wait(None);
        }
    }
}

impl<B> std::fmt::Debug for Work<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("done", &self.is_done())
            .finish()
    }
}
