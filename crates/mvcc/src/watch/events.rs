//! A response's events, as the watcher's stream hands them out: picked from the batches every
//! watcher shares, each event encoded once for all of them.

use std::sync::Arc;

use api::mvccpb::Event;
use prost::bytes::BufMut;
use prost::encoding::{self, WireType};

use super::event::Batch;

/// The events of one [`super::WatchResponse`], in revision order.
///
/// A thousand watchers of one key are sent the same event a thousand times: here each of them
/// holds the batch it came in, not a copy, and [`WatchEvents::encode`] writes the event's
/// protobuf encoding, made once for all of them. Events with their previous versions filled in
/// (a `prev_kv` watcher's) are the watcher's own.
#[derive(Debug, Clone, Default)]
pub struct WatchEvents(Repr);

#[derive(Debug, Clone)]
enum Repr {
    /// Event `i` of batch `b` for each `(b, i)` picked.
    Shared {
        batches: Vec<Arc<Batch>>,
        picked: Vec<(u32, u32)>,
    },
    Own(Vec<Event>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Own(Vec::new())
    }
}

impl WatchEvents {
    /// The events of `batches` that `keep` keeps (given each event); `None` when it keeps none.
    pub(super) fn pick(
        batches: Vec<Arc<Batch>>,
        mut keep: impl FnMut(&Event) -> bool,
    ) -> Option<WatchEvents> {
        let mut picked = Vec::new();
        for (b, batch) in batches.iter().enumerate() {
            for (i, ev) in batch.events.iter().enumerate() {
                if keep(ev) {
                    // A stream's queue holds far fewer than 2^32 batches and a batch far
                    // fewer than 2^32 events (both are bounded in bytes).
                    picked.push((b as u32, i as u32));
                }
            }
        }
        (!picked.is_empty()).then_some(WatchEvents(Repr::Shared { batches, picked }))
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Shared { picked, .. } => picked.len(),
            Repr::Own(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> Iter<'_> {
        match &self.0 {
            Repr::Shared { batches, picked } => Iter {
                own: [].iter(),
                batches,
                picked: picked.iter(),
            },
            Repr::Own(v) => Iter {
                own: v.iter(),
                batches: &[],
                picked: [].iter(),
            },
        }
    }

    /// Event `i`, if there are more.
    pub fn get(&self, i: usize) -> Option<&Event> {
        match &self.0 {
            Repr::Shared { batches, picked } => picked
                .get(i)
                .map(|&(b, i)| &batches[b as usize].events[i as usize]),
            Repr::Own(v) => v.get(i),
        }
    }

    /// The events, copied out of the shared batches.
    pub fn into_vec(self) -> Vec<Event> {
        match self.0 {
            Repr::Own(v) => v,
            Repr::Shared { .. } => self.iter().cloned().collect(),
        }
    }

    /// Writes the events as the repeated message field numbered `tag` (`events` is 11 in
    /// etcd's `WatchResponse`): the bytes prost writes for a `Vec<Event>` there.
    pub fn encode(&self, tag: u32, buf: &mut impl BufMut) {
        match &self.0 {
            Repr::Shared { batches, picked } => {
                for &(b, i) in picked {
                    let bytes = batches[b as usize].encoded(i as usize);
                    encoding::encode_key(tag, WireType::LengthDelimited, buf);
                    encoding::encode_varint(bytes.len() as u64, buf);
                    buf.put_slice(bytes);
                }
            }
            Repr::Own(v) => encoding::message::encode_repeated(tag, v, buf),
        }
    }

    /// How many bytes [`WatchEvents::encode`] writes.
    pub fn encoded_len(&self, tag: u32) -> usize {
        match &self.0 {
            Repr::Shared { batches, picked } => picked
                .iter()
                .map(|&(b, i)| {
                    let n = batches[b as usize].encoded(i as usize).len();
                    encoding::key_len(tag) + encoding::encoded_len_varint(n as u64) + n
                })
                .sum(),
            Repr::Own(v) => encoding::message::encoded_len_repeated(tag, v),
        }
    }
}

impl From<Vec<Event>> for WatchEvents {
    fn from(v: Vec<Event>) -> Self {
        WatchEvents(Repr::Own(v))
    }
}

impl PartialEq for WatchEvents {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl std::ops::Index<usize> for WatchEvents {
    type Output = Event;

    fn index(&self, i: usize) -> &Event {
        match self.get(i) {
            Some(ev) => ev,
            None => panic!("event {i} of {}", self.len()),
        }
    }
}

impl IntoIterator for WatchEvents {
    type Item = Event;
    type IntoIter = std::vec::IntoIter<Event>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<'a> IntoIterator for &'a WatchEvents {
    type Item = &'a Event;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The events of a [`WatchEvents`], in order: a watcher's own, or the shared ones it picked
/// (one of the two is empty).
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    own: std::slice::Iter<'a, Event>,
    batches: &'a [Arc<Batch>],
    picked: std::slice::Iter<'a, (u32, u32)>,
}

impl<'a> Iter<'a> {
    fn shared(&self, (b, i): (u32, u32)) -> &'a Event {
        &self.batches[b as usize].events[i as usize]
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Event;

    fn next(&mut self) -> Option<&'a Event> {
        if let Some(ev) = self.own.next() {
            return Some(ev);
        }
        let &p = self.picked.next()?;
        Some(self.shared(p))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.own.len() + self.picked.len();
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if let Some(&p) = self.picked.next_back() {
            return Some(self.shared(p));
        }
        self.own.next_back()
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use api::etcdserverpb::WatchResponse;
    use api::mvccpb::{event::EventType, KeyValue};
    use prost::Message;

    use super::*;

    fn put(key: &[u8], rev: i64) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue {
                key: key.to_vec(),
                value: vec![b'v'; rev as usize * 50],
                create_revision: 2,
                mod_revision: rev,
                version: rev - 1,
                lease: 0,
            }),
            prev_kv: None,
        }
    }

    /// The shared encoding is byte for byte what prost writes for the same response.
    #[test]
    fn encodes_as_prost_does() {
        let batches = vec![
            Batch::new(vec![put(b"a", 2), put(b"b", 2)]),
            Batch::new(vec![put(b"a", 3)]),
        ];
        let events = WatchEvents::pick(batches, |ev| ev.kv.as_ref().unwrap().key == b"a").unwrap();
        assert_eq!(events.len(), 2);
        let expected = vec![put(b"a", 2), put(b"a", 3)];
        assert!(events.iter().eq(expected.iter()));
        assert!(events.iter().rev().eq(expected.iter().rev()));

        let head = WatchResponse {
            watch_id: 7,
            ..Default::default()
        };
        let mut ours = head.encode_to_vec();
        events.encode(11, &mut ours);
        let mut whole = head.clone();
        whole.events = expected.clone();
        assert_eq!(ours, whole.encode_to_vec());
        assert_eq!(
            events.encoded_len(11),
            whole.encoded_len() - head.encoded_len()
        );

        let own = WatchEvents::from(expected.clone());
        assert_eq!(own, events);
        let mut theirs = head.encode_to_vec();
        own.encode(11, &mut theirs);
        assert_eq!(theirs, ours);
        assert_eq!(events.into_vec(), expected);
    }

    #[test]
    fn picks_nothing_from_nothing_wanted() {
        let batches = vec![Batch::new(vec![put(b"a", 2)])];
        assert!(WatchEvents::pick(batches, |_| false).is_none());
    }
}
