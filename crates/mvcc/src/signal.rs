//! Waking a background thread: for work, or to stop.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// A background thread's doorbell.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    /// (stop requested, work requested)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Signal {
    /// Asks the thread to run now.
    pub(crate) fn kick(&self) {
        self.state.lock().1 = true;
        self.cv.notify_all();
    }

    /// Asks the thread to end.
    pub(crate) fn stop(&self) {
        self.state.lock().0 = true;
        self.cv.notify_all();
    }

    /// Waits for a kick, a stop or `timeout`, whichever comes first; false if the thread
    /// should end.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let mut s = self.state.lock();
        if !s.0 && !s.1 {
            self.cv.wait_for(&mut s, timeout);
        }
        s.1 = false;
        !s.0
    }
}
