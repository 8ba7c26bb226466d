//! Encoding response header blocks.
//!
//! A server's responses repeat a few fields (`content-type: application/grpc`,
//! `grpc-status: 0`): those are added to the dynamic table once and sent as one-byte indexes
//! afterwards. Everything else goes as a literal without indexing, so the table holds only
//! what was chosen and its size needs no bookkeeping beyond the peer's limit.

use std::sync::OnceLock;

use bytes::Bytes;

use super::huffman;
use super::table::{entry_size, Dynamic, STATIC};

/// The encoding side of one connection.
#[derive(Debug)]
pub(crate) struct Encoder {
    table: Dynamic,
    /// The smallest table size since the last block, when it changed: the next block starts
    /// by announcing it, then the current size if larger (RFC 7541, 4.2).
    low: Option<usize>,
    /// Fixed fields' encodings that were references to a table ([`Encoder::fixed`]).
    fixed: Vec<Fixed>,
}

/// A fixed field (a name and value the program holds, known by their addresses) and its
/// encoding as a reference to a table, good while the dynamic table has not changed since.
#[derive(Debug)]
struct Fixed {
    name: &'static [u8],
    value: &'static [u8],
    /// The table's changes when it was encoded.
    table: u64,
    bytes: [u8; 4],
    len: usize,
}

/// How many fixed fields' encodings an encoder keeps.
const FIXED: usize = 8;

/// The largest table this encoder keeps, whatever the peer allows.
const MAX_TABLE: usize = 4096;

/// Appends an integer with an `n`-bit prefix, the prefix byte's high bits being `flags`.
fn integer(out: &mut Vec<u8>, flags: u8, n: u8, mut v: usize) {
    let mask = (1usize << n) - 1;
    if v < mask {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | mask as u8);
    v -= mask;
    while v >= 0x80 {
        out.push(0x80 | (v & 0x7f) as u8);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a string literal, Huffman-coded when that is shorter.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    let h = huffman::encoded_len(s);
    if h < s.len() {
        integer(out, 0x80, 7, h);
        huffman::encode(s, out);
    } else {
        integer(out, 0, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// The static table's names, each once, ordered by length then bytes (the cheap comparison
/// first), with the range of indexes (from 1) holding it: the table keeps a name's entries
/// together.
fn static_names() -> &'static [(&'static [u8], std::ops::Range<usize>)] {
    static NAMES: OnceLock<Vec<(&'static [u8], std::ops::Range<usize>)>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names: Vec<(&'static [u8], std::ops::Range<usize>)> = Vec::new();
        for (i, (n, _)) in STATIC.iter().enumerate() {
            match names.last_mut() {
                Some((last, r)) if *last == n.as_bytes() => r.end = i + 2,
                _ => names.push((n.as_bytes(), i + 1..i + 2)),
            }
        }
        names.sort_by(|a, b| (a.0.len(), a.0).cmp(&(b.0.len(), b.0)));
        names
    })
}

/// The static entry (index from 1) holding `name: value`, and one holding `name`.
fn static_index(name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
    let names = static_names();
    let Ok(at) = names.binary_search_by(|(n, _)| (n.len(), *n).cmp(&(name.len(), name))) else {
        return (None, None);
    };
    let range = names[at].1.clone();
    let first = range.start;
    let exact = range
        .into_iter()
        .find(|&i| STATIC[i - 1].1.as_bytes() == value);
    (exact, Some(first))
}

impl Encoder {
    pub(crate) fn new() -> Encoder {
        // The default table size until the peer's SETTINGS say otherwise.
        Encoder {
            table: Dynamic::new(MAX_TABLE),
            low: None,
            fixed: Vec::new(),
        }
    }

    /// [`field`](Self::field) for a field the program holds (a response's `:status: 200`,
    /// `content-type: application/grpc`): once it is a reference to a table, its bytes are
    /// kept and appended as they are until the dynamic table changes, without looking for it
    /// in the tables again.
    pub(crate) fn fixed(
        &mut self,
        out: &mut Vec<u8>,
        name: &'static [u8],
        value: &'static [u8],
        cache: bool,
    ) {
        let table = self.table.changes();
        // The same addresses and lengths: the same bytes (they never change).
        let same = |f: &&Fixed| std::ptr::eq(f.name, name) && std::ptr::eq(f.value, value);
        if let Some(f) = self.fixed.iter().find(same).filter(|f| f.table == table) {
            out.extend_from_slice(&f.bytes[..f.len]);
            return;
        }
        let start = out.len();
        self.field(out, name, value, cache);
        let len = out.len() - start;
        if self.table.changes() != table || len > 4 || out[start] & 0x80 == 0 {
            return; // added to the table, or a literal
        }
        let mut bytes = [0; 4];
        bytes[..len].copy_from_slice(&out[start..]);
        let f = Fixed {
            name,
            value,
            table,
            bytes,
            len,
        };
        match self.fixed.iter().position(|f| same(&f)) {
            Some(i) => self.fixed[i] = f,
            None if self.fixed.len() < FIXED => self.fixed.push(f),
            None => self.fixed[0] = f,
        }
    }

    /// The peer's SETTINGS_HEADER_TABLE_SIZE.
    pub(crate) fn set_max_size(&mut self, limit: usize) {
        let size = limit.min(MAX_TABLE);
        if size != self.table.max_size() {
            self.table.set_max_size(size);
            self.low = Some(self.low.map_or(size, |l| l.min(size)));
        }
    }

    /// Starts a header block: announces a table size change since the last one.
    pub(crate) fn begin(&mut self, out: &mut Vec<u8>) {
        if let Some(low) = self.low.take() {
            integer(out, 0x20, 5, low);
            if low != self.table.max_size() {
                integer(out, 0x20, 5, self.table.max_size());
            }
        }
    }

    /// Appends one field. `cache` adds it to the dynamic table when new, so it is one byte
    /// from then on; only fields that repeat unchanged should be cached.
    pub(crate) fn field(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8], cache: bool) {
        let (exact, by_name) = static_index(name, value);
        if let Some(i) = exact {
            integer(out, 0x80, 7, i);
            return;
        }
        if let Some(i) = self.table.find(name, value) {
            integer(out, 0x80, 7, STATIC.len() + 1 + i);
            return;
        }
        let cache = cache && entry_size(name, value) <= self.table.max_size() / 2;
        let (flags, n) = if cache { (0x40, 6) } else { (0x00, 4) };
        match by_name {
            Some(i) => integer(out, flags, n, i),
            None => {
                integer(out, flags, n, 0);
                string(out, name);
            }
        }
        string(out, value);
        if cache {
            self.table
                .insert(Bytes::copy_from_slice(name), Bytes::copy_from_slice(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Decoder;
    use super::*;

    fn decode(d: &mut Decoder, block: Vec<u8>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        d.decode(&Bytes::from(block), |n, v| {
            out.push((n.to_vec(), v.to_vec()))
        })
        .unwrap();
        out
    }

    #[test]
    fn cached_fields_shrink_to_one_byte_and_decode() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        let fields: [(&[u8], &[u8], bool); 4] = [
            (b":status", b"200", false),
            (b"content-type", b"application/grpc", true),
            (b"grpc-status", b"0", true),
            (b"grpc-message", b"key not found: \xff", false),
        ];
        let mut sizes = Vec::new();
        for _ in 0..3 {
            let mut block = Vec::new();
            e.begin(&mut block);
            for (n, v, c) in fields {
                e.field(&mut block, n, v, c);
            }
            sizes.push(block.len());
            let got = decode(&mut d, block);
            let want: Vec<_> = fields
                .iter()
                .map(|f| (f.0.to_vec(), f.1.to_vec()))
                .collect();
            assert_eq!(got, want);
        }
        assert!(sizes[1] < sizes[0], "{sizes:?}");
        assert_eq!(sizes[1], sizes[2]);
    }

    #[test]
    fn a_smaller_peer_table_is_announced_and_respected() {
        let mut e = Encoder::new();
        let mut d = Decoder::new(4096);
        let mut block = Vec::new();
        e.begin(&mut block);
        e.field(&mut block, b"grpc-status", b"0", true);
        decode(&mut d, block);
        // The peer shrinks its table to nothing: nothing may be indexed any more.
        e.set_max_size(0);
        let mut block = Vec::new();
        e.begin(&mut block);
        e.field(&mut block, b"grpc-status", b"0", true);
        assert_eq!(block[0], 0x20, "size update first");
        assert_eq!(
            decode(&mut d, block),
            vec![(b"grpc-status".to_vec(), b"0".to_vec())]
        );
        let mut block = Vec::new();
        e.begin(&mut block);
        e.field(&mut block, b"grpc-status", b"0", true);
        assert_ne!(block[0] & 0x80, 0x80, "not an index into an empty table");
    }

    /// The lookup finds what a scan of the whole static table finds: an entry holding the
    /// field, else the first holding its name.
    #[test]
    fn static_lookup_matches_a_scan_of_the_table() {
        let scan = |name: &[u8], value: &[u8]| {
            let at = |f: &dyn Fn(&(&str, &str)) -> bool| STATIC.iter().position(f).map(|i| i + 1);
            let exact = at(&|(n, v)| n.as_bytes() == name && v.as_bytes() == value);
            (exact, at(&|(n, _)| n.as_bytes() == name))
        };
        let mut fields: Vec<(&[u8], &[u8])> = Vec::new();
        for (n, v) in STATIC {
            fields.extend([(n.as_bytes(), v.as_bytes()), (n.as_bytes(), b"other")]);
        }
        fields.extend([
            (&b"grpc-status"[..], &b"0"[..]),
            (b"grpc-message", b""),
            (b":statu", b"200"),
            (b":statuss", b"200"),
            (b"", b""),
            (b"Content-Type", b"application/grpc"),
        ]);
        for (n, v) in fields {
            assert_eq!(static_index(n, v), scan(n, v), "{n:?} {v:?}");
        }
    }

    #[test]
    fn long_integers_round_trip() {
        let mut d = Decoder::new(4096);
        let mut e = Encoder::new();
        let long = vec![b'v'; 3000];
        let mut block = Vec::new();
        e.begin(&mut block);
        e.field(&mut block, b"x-long", &long, false);
        assert_eq!(decode(&mut d, block), vec![(b"x-long".to_vec(), long)]);
    }

    /// A fixed field's kept bytes are what looking it up again would write, block after
    /// block, across entries added to the table (which move its entries' indexes) and a
    /// smaller table (which evicts them).
    #[test]
    fn fixed_fields_encode_as_looked_up_again() {
        let (mut looked, mut kept) = (Encoder::new(), Encoder::new());
        let fixed: [(&'static [u8], &'static [u8], bool); 3] = [
            (b":status", b"200", false),
            (b"content-type", b"application/grpc", true),
            (b"grpc-status", b"0", true),
        ];
        for step in 0..8 {
            if step == 3 || step == 5 {
                let name = format!("x-step-{step}");
                for e in [&mut looked, &mut kept] {
                    e.field(&mut Vec::new(), name.as_bytes(), b"v", true);
                }
            }
            if step == 6 {
                looked.set_max_size(64);
                kept.set_max_size(64);
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            looked.begin(&mut a);
            kept.begin(&mut b);
            for (n, v, c) in fixed {
                looked.field(&mut a, n, v, c);
                kept.fixed(&mut b, n, v, c);
            }
            assert_eq!(a, b, "step {step}");
        }
        assert!(!kept.fixed.is_empty(), "the references were kept");
    }
}
