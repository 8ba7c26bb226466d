//! What kvd's process tests share, so that each is written once: a free loopback port for a
//! server a test starts ([`free_port`]), waiting on an observable condition instead of sleeping
//! ([`wait_for`]), and the crash-child runner that re-runs a test binary as a child and
//! SIGKILLs it ([`CrashChild`]).
//!
//! A dev-dependency only; nothing here is built into kvd.

mod child;
mod ports;
mod wait;

pub use child::{CrashChild, Outcome};
pub use ports::free_port;
pub use wait::{wait_for, wait_for_or};
