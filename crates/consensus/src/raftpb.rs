//! raft's messages, entries and hard states in protobuf's encoding, written and read directly.
//!
//! Every replicated write encodes its entry into each member's log and its messages onto the
//! peer links, and each member parses the messages it receives; rust-protobuf's general
//! writer took about 1,700 instructions for a message carrying one small entry (a leader sends
//! four or so per write), its reader about 2,000. These write the same bytes — field by field
//! in the order the generated code writes them, so the two agree byte for byte — and read
//! what rust-protobuf reads into the same message, in a fraction of that (both tested against
//! rust-protobuf). A message with a snapshot, or anything carrying a field or value this
//! version does not know, or bytes the reader is not sure of, goes through rust-protobuf.

use protobuf::{Message as _, ProtobufEnum};
use raft::eraftpb::{Entry, EntryType, HardState, Message, MessageType};

/// Parses a raft message as rust-protobuf's `parse_from_bytes` does.
pub(crate) fn parse_message(b: &[u8]) -> protobuf::ProtobufResult<Message> {
    match read_message(b) {
        Some(m) => Ok(m),
        None => Message::parse_from_bytes(b),
    }
}

/// Appends `m`, its length first (a frame of the peer stream).
pub(crate) fn put_message_delimited(
    buf: &mut Vec<u8>,
    m: &Message,
) -> protobuf::ProtobufResult<()> {
    if !plain_message(m) {
        return m.write_length_delimited_to_vec(buf);
    }
    let len = message_len(m);
    buf.reserve(varint_len(len as u64) + len);
    varint(buf, len as u64);
    put_message(buf, m);
    Ok(())
}

/// Appends `e`.
pub(crate) fn put_entry(buf: &mut Vec<u8>, e: &Entry) -> protobuf::ProtobufResult<()> {
    if !known_only(e.get_unknown_fields()) {
        return e.write_to_vec(buf);
    }
    buf.reserve(entry_len(e));
    put_plain_entry(buf, e);
    Ok(())
}

/// Appends `hs`.
pub(crate) fn put_hard_state(buf: &mut Vec<u8>, hs: &HardState) -> protobuf::ProtobufResult<()> {
    if !known_only(hs.get_unknown_fields()) {
        return hs.write_to_vec(buf);
    }
    uint(buf, 1, hs.term);
    uint(buf, 2, hs.vote);
    uint(buf, 3, hs.commit);
    Ok(())
}

/// Whether `m` is all this module writes itself: no snapshot, no unknown fields.
fn plain_message(m: &Message) -> bool {
    !m.has_snapshot()
        && known_only(m.get_unknown_fields())
        && m.entries.iter().all(|e| known_only(e.get_unknown_fields()))
}

fn known_only(u: &protobuf::UnknownFields) -> bool {
    u.iter().next().is_none()
}

fn put_message(buf: &mut Vec<u8>, m: &Message) {
    uint(buf, 1, m.get_msg_type() as u64);
    uint(buf, 2, m.to);
    uint(buf, 3, m.from);
    uint(buf, 4, m.term);
    uint(buf, 5, m.log_term);
    uint(buf, 6, m.index);
    for e in &m.entries {
        varint(buf, key(7, LEN));
        varint(buf, entry_len(e) as u64);
        put_plain_entry(buf, e);
    }
    uint(buf, 8, m.commit);
    uint(buf, 15, m.commit_term);
    uint(buf, 13, m.request_snapshot);
    uint(buf, 10, u64::from(m.reject));
    uint(buf, 11, m.reject_hint);
    bytes(buf, 12, &m.context);
    uint(buf, 14, m.deprecated_priority);
    // An int64: a negative one is ten bytes of varint, as protobuf writes it.
    uint(buf, 16, m.priority as u64);
}

fn message_len(m: &Message) -> usize {
    let entries: usize = (m.entries.iter())
        .map(|e| {
            let n = entry_len(e);
            varint_len(key(7, LEN)) + varint_len(n as u64) + n
        })
        .sum();
    uint_len(1, m.get_msg_type() as u64)
        + uint_len(2, m.to)
        + uint_len(3, m.from)
        + uint_len(4, m.term)
        + uint_len(5, m.log_term)
        + uint_len(6, m.index)
        + entries
        + uint_len(8, m.commit)
        + uint_len(15, m.commit_term)
        + uint_len(13, m.request_snapshot)
        + uint_len(10, u64::from(m.reject))
        + uint_len(11, m.reject_hint)
        + bytes_len(12, &m.context)
        + uint_len(14, m.deprecated_priority)
        + uint_len(16, m.priority as u64)
}

fn put_plain_entry(buf: &mut Vec<u8>, e: &Entry) {
    uint(buf, 1, e.get_entry_type() as u64);
    uint(buf, 2, e.term);
    uint(buf, 3, e.index);
    bytes(buf, 4, &e.data);
    bytes(buf, 6, &e.context);
    uint(buf, 5, u64::from(e.sync_log));
}

fn entry_len(e: &Entry) -> usize {
    uint_len(1, e.get_entry_type() as u64)
        + uint_len(2, e.term)
        + uint_len(3, e.index)
        + bytes_len(4, &e.data)
        + bytes_len(6, &e.context)
        + uint_len(5, u64::from(e.sync_log))
}

/// `b` as a message, if it holds only what this module reads (`None` leaves it to
/// rust-protobuf, which parses it or says why not).
fn read_message(b: &[u8]) -> Option<Message> {
    let mut r = Reader(b);
    let mut m = Message::default();
    while !r.0.is_empty() {
        let k = r.varint()?;
        match (k >> 3, k & 7) {
            (1, VARINT) => m.set_msg_type(MessageType::from_i32(r.small()?)?),
            (2, VARINT) => m.to = r.varint()?,
            (3, VARINT) => m.from = r.varint()?,
            (4, VARINT) => m.term = r.varint()?,
            (5, VARINT) => m.log_term = r.varint()?,
            (6, VARINT) => m.index = r.varint()?,
            (7, LEN) => m.entries.push(read_entry(r.bytes()?)?),
            (8, VARINT) => m.commit = r.varint()?,
            (10, VARINT) => m.reject = r.flag()?,
            (11, VARINT) => m.reject_hint = r.varint()?,
            (12, LEN) => m.context = r.bytes()?.to_vec().into(),
            (13, VARINT) => m.request_snapshot = r.varint()?,
            (14, VARINT) => m.deprecated_priority = r.varint()?,
            (15, VARINT) => m.commit_term = r.varint()?,
            (16, VARINT) => m.priority = r.varint()? as i64,
            _ => return None,
        }
    }
    Some(m)
}

fn read_entry(b: &[u8]) -> Option<Entry> {
    let mut r = Reader(b);
    let mut e = Entry::default();
    while !r.0.is_empty() {
        let k = r.varint()?;
        match (k >> 3, k & 7) {
            (1, VARINT) => e.set_entry_type(EntryType::from_i32(r.small()?)?),
            (2, VARINT) => e.term = r.varint()?,
            (3, VARINT) => e.index = r.varint()?,
            (4, LEN) => e.data = r.bytes()?.to_vec().into(),
            (5, VARINT) => e.sync_log = r.flag()?,
            (6, LEN) => e.context = r.bytes()?.to_vec().into(),
            _ => return None,
        }
    }
    Some(e)
}

/// What is left to read; each read is `None` where rust-protobuf might read otherwise.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A varint of at most ten bytes whose value fits 64 bits (rust-protobuf drops the bits
    /// of a longer one's tenth byte; those are left to it).
    fn varint(&mut self) -> Option<u64> {
        // Most are one byte: tags, types, small lengths.
        if let Some((&byte, rest)) = self.0.split_first() {
            if byte < 0x80 {
                self.0 = rest;
                return Some(u64::from(byte));
            }
        }
        let mut v = 0u64;
        for (i, &byte) in self.0.iter().enumerate().take(10) {
            if i == 9 && byte > 1 {
                return None;
            }
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                self.0 = &self.0[i + 1..];
                return Some(v);
            }
        }
        None
    }

    /// An enum's number (rust-protobuf reads 32 bits of the varint: a larger one is left).
    fn small(&mut self) -> Option<i32> {
        i32::try_from(self.varint()?).ok()
    }

    /// A bool written as protobuf writes one.
    fn flag(&mut self) -> Option<bool> {
        match self.varint()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        if n > self.0.len() {
            return None;
        }
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(b)
    }
}

/// The wire types used here: a varint, a length-delimited field.
const VARINT: u64 = 0;
const LEN: u64 = 2;

fn key(field: u64, wire: u64) -> u64 {
    field << 3 | wire
}

/// A varint field, left out at zero (proto3's default).
fn uint(buf: &mut Vec<u8>, field: u64, v: u64) {
    if v != 0 {
        varint(buf, key(field, VARINT));
        varint(buf, v);
    }
}

fn uint_len(field: u64, v: u64) -> usize {
    match v {
        0 => 0,
        v => varint_len(key(field, VARINT)) + varint_len(v),
    }
}

/// A bytes field, left out when empty.
fn bytes(buf: &mut Vec<u8>, field: u64, b: &[u8]) {
    if !b.is_empty() {
        varint(buf, key(field, LEN));
        varint(buf, b.len() as u64);
        buf.extend_from_slice(b);
    }
}

fn bytes_len(field: u64, b: &[u8]) -> usize {
    match b.len() {
        0 => 0,
        n => varint_len(key(field, LEN)) + varint_len(n as u64) + n,
    }
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use raft::eraftpb::{ConfState, Snapshot};

    fn any_u64() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0u64), 1..300u64, any::<u64>()]
    }

    fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![Just(Vec::new()), prop::collection::vec(any::<u8>(), 1..300)]
    }

    prop_compose! {
        fn any_entry()(t in 0..3i32, term in any_u64(), index in any_u64(), data in any_bytes(),
                       context in any_bytes(), sync_log in any::<bool>()) -> Entry {
            let mut e = Entry::default();
            e.set_entry_type(match t {
                0 => EntryType::EntryNormal,
                1 => EntryType::EntryConfChange,
                _ => EntryType::EntryConfChangeV2,
            });
            e.term = term;
            e.index = index;
            e.data = data.into();
            e.context = context.into();
            e.sync_log = sync_log;
            e
        }
    }

    prop_compose! {
        fn any_message()(t in 0..19i32, ids in prop::array::uniform8(any_u64()),
                         entries in prop::collection::vec(any_entry(), 0..4),
                         reject in any::<bool>(), context in any_bytes(), priority in any::<i64>(),
                         snapshot in prop::option::weighted(0.1, any_u64()))
                         -> Message {
            let mut m = Message::default();
            m.set_msg_type(MessageType::from_i32(t).unwrap_or(MessageType::MsgAppend));
            [m.to, m.from, m.term, m.log_term, m.index, m.commit, m.commit_term,
             m.request_snapshot] = ids;
            m.reject_hint = ids[0] ^ ids[7];
            m.deprecated_priority = ids[1] ^ ids[6];
            m.entries = entries.into();
            m.reject = reject;
            m.context = context.into();
            m.priority = priority;
            if let Some(index) = snapshot {
                let mut s = Snapshot::default();
                s.mut_metadata().index = index;
                s.mut_metadata().set_conf_state(ConfState::from((vec![1, 2], vec![3])));
                m.set_snapshot(s);
            }
            m
        }
    }

    proptest! {
        #[test]
        fn messages_are_written_as_protobuf_writes_them(m in any_message()) {
            let mut ours = vec![7];
            put_message_delimited(&mut ours, &m).unwrap();
            let mut theirs = vec![7];
            m.write_length_delimited_to_vec(&mut theirs).unwrap();
            prop_assert_eq!(&ours, &theirs);
            let mut frame = Reader(&ours[1..]);
            let back = parse_message(frame.bytes().unwrap()).unwrap();
            prop_assert!(frame.0.is_empty());
            prop_assert_eq!(back, m);
        }

        #[test]
        fn entries_and_hard_states_are_written_as_protobuf_writes_them(
            e in any_entry(), hs in prop::array::uniform3(any_u64()),
        ) {
            let (mut ours, mut theirs) = (vec![1], vec![1]);
            put_entry(&mut ours, &e).unwrap();
            e.write_to_vec(&mut theirs).unwrap();
            prop_assert_eq!(&ours, &theirs);
            let mut h = HardState::default();
            [h.term, h.vote, h.commit] = hs;
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            put_hard_state(&mut ours, &h).unwrap();
            h.write_to_vec(&mut theirs).unwrap();
            prop_assert_eq!(ours, theirs);
        }
    }

    proptest! {
        #[test]
        fn messages_are_read_as_protobuf_reads_them(m in any_message()) {
            let mut b = Vec::new();
            m.write_to_vec(&mut b).unwrap();
            prop_assert_eq!(read_message(&b).is_some(), !m.has_snapshot());
            prop_assert_eq!(parse_message(&b).unwrap(), m);
        }

        /// Whatever the reader takes (valid messages cut and overwritten at random), it
        /// reads as rust-protobuf does.
        #[test]
        fn what_the_reader_takes_protobuf_reads_the_same(
            m in any_message(), cut in any::<prop::sample::Index>(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        ) {
            let mut b = Vec::new();
            m.write_to_vec(&mut b).unwrap();
            b.truncate(cut.index(b.len() + 1));
            for (at, byte) in edits {
                if !b.is_empty() {
                    let i = at.index(b.len());
                    b[i] = byte;
                }
            }
            if let Some(ours) = read_message(&b) {
                let theirs = Message::parse_from_bytes(&b).unwrap();
                prop_assert_eq!(ours, theirs);
            }
        }
    }

    #[test]
    fn what_the_reader_leaves_to_protobuf() {
        // A tenth varint byte over 1, a bool of 2, an unknown enum value, an unknown field.
        for b in [
            &[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
            ][..],
            &[0x50, 2],
            &[0x08, 40],
            &[0xa0, 0x01, 5],
        ] {
            assert!(read_message(b).is_none(), "{b:?}");
            let _ = parse_message(b);
        }
        // Over-long but well-formed varints read as rust-protobuf reads them.
        let b = [0x10, 0x85, 0x80, 0x00, 0x18, 0x01];
        let ours = read_message(&b).unwrap();
        assert_eq!((ours.to, ours.from), (5, 1));
        assert_eq!(ours, Message::parse_from_bytes(&b).unwrap());
    }

    #[test]
    fn unknown_fields_go_through_protobuf() {
        // Field 20, a varint 5: a field of a later version, kept and written back.
        let m = Message::parse_from_bytes(&[0x08, 3, 0xa0, 0x01, 5]).unwrap();
        assert!(!known_only(m.get_unknown_fields()));
        let mut ours = Vec::new();
        put_message_delimited(&mut ours, &m).unwrap();
        assert_eq!(ours, [5, 0x08, 3, 0xa0, 0x01, 5]);
    }
}
