//! Decoding header blocks (RFC 7541, section 6).

use bytes::Bytes;

use super::table::{Dynamic, STATIC};
use super::{huffman, Error};

/// The decoding side of one connection: its dynamic table lives as long as the connection.
#[derive(Debug)]
pub(crate) struct Decoder {
    table: Dynamic,
    /// The table size we announced (SETTINGS_HEADER_TABLE_SIZE): the peer may not exceed it.
    limit: usize,
}

/// An integer with an `n`-bit prefix (RFC 7541, 5.1), starting at `src[*at]`.
fn integer(src: &[u8], at: &mut usize, n: u8) -> Result<usize, Error> {
    let mask = (1u16 << n) as usize - 1;
    let first = *src.get(*at).ok_or(Error::Truncated)? as usize & mask;
    *at += 1;
    if first < mask {
        return Ok(first);
    }
    let mut value = mask;
    let mut shift = 0;
    loop {
        let b = *src.get(*at).ok_or(Error::Truncated)?;
        *at += 1;
        // Four continuation bytes hold 28 bits: more than any table or frame.
        if shift > 21 {
            return Err(Error::Integer);
        }
        value += ((b & 0x7f) as usize) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

impl Decoder {
    pub(crate) fn new(limit: usize) -> Decoder {
        Decoder {
            table: Dynamic::new(limit),
            limit,
        }
    }

    /// Decodes one whole header block, handing each field to `field` in order. True when
    /// every field was a reference to a table's entry: the block changed nothing, and the same
    /// bytes decode to the same fields until the dynamic table changes ([`Self::changes`]).
    pub(crate) fn decode(
        &mut self,
        block: &Bytes,
        mut field: impl FnMut(Bytes, Bytes),
    ) -> Result<bool, Error> {
        let src = block.as_ref();
        let mut at = 0;
        let mut fields = false;
        let mut indexed = true;
        while at < src.len() {
            let b = src[at];
            if b & 0x80 != 0 {
                let i = integer(src, &mut at, 7)?;
                let (n, v) = self.entry(i)?;
                field(n, v);
                fields = true;
                continue;
            }
            indexed = false;
            if b & 0xc0 == 0x40 {
                let (n, v) = self.literal(block, &mut at, 6)?;
                self.table.insert(n.clone(), v.clone());
                field(n, v);
                fields = true;
            } else if b & 0xe0 == 0x20 {
                let size = integer(src, &mut at, 5)?;
                if fields || size > self.limit {
                    return Err(Error::SizeUpdate);
                }
                self.table.set_max_size(size);
            } else {
                // Without indexing (0000) or never indexed (0001): the same to a decoder.
                let (n, v) = self.literal(block, &mut at, 4)?;
                field(n, v);
                fields = true;
            }
        }
        Ok(indexed)
    }

    /// How many times the dynamic table has changed (entries added, its size set).
    pub(crate) fn changes(&self) -> u64 {
        self.table.changes()
    }

    fn entry(&self, i: usize) -> Result<(Bytes, Bytes), Error> {
        if i == 0 {
            return Err(Error::Index(0));
        }
        if let Some((n, v)) = STATIC.get(i - 1) {
            return Ok((
                Bytes::from_static(n.as_bytes()),
                Bytes::from_static(v.as_bytes()),
            ));
        }
        self.table
            .get(i - 1 - STATIC.len())
            .cloned()
            .ok_or(Error::Index(i))
    }

    /// A literal field whose name index has an `n`-bit prefix (0: a literal name follows).
    fn literal(&self, block: &Bytes, at: &mut usize, n: u8) -> Result<(Bytes, Bytes), Error> {
        let i = integer(block, at, n)?;
        let name = if i == 0 {
            string(block, at)?
        } else {
            self.entry(i)?.0
        };
        Ok((name, string(block, at)?))
    }
}

/// A string literal (RFC 7541, 5.2): a slice of the block, or its Huffman decoding.
fn string(block: &Bytes, at: &mut usize) -> Result<Bytes, Error> {
    let huff = *block.get(*at).ok_or(Error::Truncated)? & 0x80 != 0;
    let len = integer(block, at, 7)?;
    let end = at.checked_add(len).ok_or(Error::Integer)?;
    if end > block.len() {
        return Err(Error::Truncated);
    }
    let raw = block.slice(*at..end);
    *at = end;
    if !huff {
        return Ok(raw);
    }
    let mut out = Vec::with_capacity(len * 8 / 5 + 1);
    huffman::decode(&raw, &mut out)?;
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Bytes {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect::<Vec<_>>()
            .into()
    }

    fn fields(d: &mut Decoder, block: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        d.decode(&hex(block), |n, v| {
            out.push((
                String::from_utf8(n.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            ))
        })
        .unwrap();
        out
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// RFC 7541, C.4: three requests with Huffman coding, sharing one dynamic table.
    #[test]
    fn rfc_requests_with_huffman() {
        let mut d = Decoder::new(4096);
        assert_eq!(
            fields(&mut d, "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ])
        );
        assert_eq!(
            fields(&mut d, "8286 84be 5886 a8eb 1064 9cbf"),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        assert_eq!(
            fields(
                &mut d,
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"
            ),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
        assert_eq!(d.table.len(), 3);
    }

    /// RFC 7541, C.5: responses with a 256-byte table, so entries are evicted.
    #[test]
    fn rfc_responses_with_eviction() {
        let mut d = Decoder::new(256);
        let first = fields(
            &mut d,
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
             6c65 2e63 6f6d",
        );
        assert_eq!(first[0], (":status".into(), "302".into()));
        assert_eq!(
            fields(&mut d, "4803 3330 37c1 c0bf")[0],
            (":status".into(), "307".into())
        );
        assert_eq!(d.table.len(), 4);
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let mut d = Decoder::new(4096);
        let mut run = |b: &[u8]| d.decode(&Bytes::copy_from_slice(b), |_, _| {});
        assert_eq!(run(&[0x80]), Err(Error::Index(0)));
        assert_eq!(run(&[0xbe]), Err(Error::Index(62)));
        assert_eq!(run(&[0x41, 0x05, b'a']), Err(Error::Truncated));
        assert_eq!(
            run(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Err(Error::Integer)
        );
        assert_eq!(run(&[0x3f, 0xe2, 0x1f]), Err(Error::SizeUpdate)); // 4097
        assert_eq!(run(&[0x3f, 0xe1, 0x1f]), Ok(false)); // 4096
        assert_eq!(run(&[0x82, 0x20]), Err(Error::SizeUpdate)); // after a field
        assert_eq!(run(&[0x20, 0x82]), Ok(false));
        assert_eq!(run(&[0x82, 0x86]), Ok(true));
    }

    proptest::proptest! {
        /// Arbitrary bytes are a result, never a panic.
        #[test]
        fn arbitrary_input_never_panics(b in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut d = Decoder::new(4096);
            let _ = d.decode(&Bytes::from(b), |_, _| {});
        }
    }
}
