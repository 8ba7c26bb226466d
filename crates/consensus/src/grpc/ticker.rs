//! The peer links' keep-alive ticks.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Ticks a period apart, the first at once, the next a period after the last was taken (as
/// tokio's `interval` with `MissedTickBehavior::Delay`). A link's loop asks for the next tick
/// each time anything wakes the link, several times a write: between ticks that costs a look
/// at whether the timer fired, not a pass through tokio's timer, for the timer keeps the waker
/// it was last polled with and fires before it wakes it.
#[derive(Debug)]
pub(super) struct Ticker {
    sleep: Pin<Box<Sleep>>,
    period: Duration,
    /// The waker the timer holds, since its last reset.
    waker: Option<Waker>,
}

impl Ticker {
    pub(super) fn new(period: Duration) -> Ticker {
        Ticker {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            period,
            waker: None,
        }
    }

    pub(super) async fn tick(&mut self) {
        std::future::poll_fn(|cx| self.poll_tick(cx)).await
    }

    fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let holds = self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if holds && !self.sleep.is_elapsed() {
            return Poll::Pending;
        }
        self.waker = Some(cx.waker().clone());
        ready!(self.sleep.as_mut().poll(cx));
        self.sleep.as_mut().reset(Instant::now() + self.period);
        self.waker = None;
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Its ticks come a period apart while something else wakes the loop far more often.
    #[tokio::test(start_paused = true)]
    async fn ticks_come_a_period_apart_however_often_the_loop_wakes() {
        let mut t = Ticker::new(Duration::from_millis(100));
        let mut busy = tokio::time::interval(Duration::from_millis(1));
        let start = Instant::now();
        let mut ticks = Vec::new();
        while ticks.len() < 5 && start.elapsed() < Duration::from_secs(1) {
            tokio::select! {
                _ = busy.tick() => {}
                _ = t.tick() => ticks.push(start.elapsed().as_millis()),
            }
        }
        assert_eq!(ticks, [0, 100, 200, 300, 400]);
    }

    /// A tick taken late: the next is a period after it.
    #[tokio::test(start_paused = true)]
    async fn a_late_tick_delays_the_next() {
        let mut t = Ticker::new(Duration::from_millis(100));
        let start = Instant::now();
        t.tick().await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        t.tick().await;
        let next = tokio::time::timeout(Duration::from_secs(1), t.tick()).await;
        assert!(next.is_ok(), "the next tick came");
        assert_eq!(start.elapsed().as_millis(), 350);
    }
}
