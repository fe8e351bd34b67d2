//! raft-rs logs through `slog`; this bridge forwards its records as `tracing` events with the
//! node and group as fields, so Raft logs land with the rest of Ferry's.

use std::fmt::{self, Write as _};

use slog::{Drain, Key, Level, OwnedKVList, Record, Serializer, KV};

use crate::ids::{GroupId, NodeId};

/// A slog logger for one group's raft-rs instance, forwarding to `tracing` under the target
/// `ferry_multiraft::raft`.
pub fn raft_logger(node: NodeId, group: GroupId) -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!("node" => node.0, "group" => group.0))
}

/// A slog `Drain` that emits each record as a `tracing` event.
#[derive(Debug, Clone, Copy)]
struct TracingDrain;

/// Key/values of a record: node and group as numbers, the rest as `key=value` text.
#[derive(Default)]
struct Fields {
    node: u64,
    group: u64,
    rest: String,
}

impl Serializer for Fields {
    fn emit_u64(&mut self, key: Key, value: u64) -> slog::Result {
        match key {
            "node" => self.node = value,
            "group" => self.group = value,
            _ => self.emit_arguments(key, &format_args!("{value}"))?,
        }
        Ok(())
    }

    fn emit_arguments(&mut self, key: Key, value: &fmt::Arguments) -> slog::Result {
        if !self.rest.is_empty() {
            self.rest.push(' ');
        }
        // Writing into a String cannot fail.
        let _ = write!(self.rest, "{key}={value}");
        Ok(())
    }
}

/// Emits `record` at `$level` if anyone listens there: raft-rs logs a lot at debug level, and
/// nothing is formatted for nobody.
macro_rules! forward {
    ($level:expr, $record:expr, $values:expr) => {
        if tracing::enabled!(target: "ferry_multiraft::raft", $level) {
            let fields = Fields::of($record, $values);
            tracing::event!(
                target: "ferry_multiraft::raft",
                $level,
                node = fields.node,
                group = fields.group,
                kv = %fields.rest,
                "{}",
                $record.msg()
            )
        }
    };
}

impl Fields {
    fn of(record: &Record<'_>, values: &OwnedKVList) -> Self {
        let mut fields = Fields::default();
        // Serializing into `Fields` never fails.
        let _ = values.serialize(record, &mut fields);
        let _ = record.kv().serialize(record, &mut fields);
        fields
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            Level::Critical | Level::Error => forward!(tracing::Level::ERROR, record, values),
            Level::Warning => forward!(tracing::Level::WARN, record, values),
            Level::Info => forward!(tracing::Level::INFO, record, values),
            Level::Debug => forward!(tracing::Level::DEBUG, record, values),
            Level::Trace => forward!(tracing::Level::TRACE, record, values),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_are_split_into_node_group_and_text() {
        let logger = raft_logger(NodeId(2), GroupId(7));
        // Without a subscriber nothing is emitted; this only proves the drain does not panic.
        slog::info!(logger, "became leader"; "term" => 3u64, "state" => "x");
        let mut fields = Fields::default();
        fields.emit_u64("group", 7).unwrap();
        fields.emit_u64("term", 3).unwrap();
        fields.emit_arguments("state", &format_args!("x")).unwrap();
        assert_eq!(
            (fields.node, fields.group, fields.rest.as_str()),
            (0, 7, "term=3 state=x")
        );
    }
}
