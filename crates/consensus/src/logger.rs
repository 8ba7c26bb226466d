//! raft-rs logs through `slog`; this drain hands its records to `tracing`, so kvd has one log.

use std::fmt::{self, Write};

use slog::{Drain, Level, OwnedKVList, Record, KV};

use ids::MemberId;

#[derive(Debug)]
struct ToTracing;

struct Fields(String);

impl slog::Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, val: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl Drain for ToTracing {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut fields = Fields(String::new());
        let _ = record.kv().serialize(record, &mut fields);
        let _ = values.serialize(record, &mut fields);
        let msg = record.msg();
        let f = fields.0;
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{msg}{f}"),
            Level::Warning => tracing::warn!(target: "raft", "{msg}{f}"),
            Level::Info => tracing::info!(target: "raft", "{msg}{f}"),
            Level::Debug => tracing::debug!(target: "raft", "{msg}{f}"),
            Level::Trace => tracing::trace!(target: "raft", "{msg}{f}"),
        }
        Ok(())
    }
}

/// A logger for raft-rs, tagged with the member id.
pub(crate) fn raft_logger(id: MemberId) -> slog::Logger {
    slog::Logger::root(ToTracing.fuse(), slog::o!("raft_id" => id.to_string()))
}
