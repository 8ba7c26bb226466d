//! HPACK's Huffman code (RFC 7541, Appendix B).
//!
//! Decoding runs a state machine four bits at a time: the states are the inner nodes of the
//! code tree, built once from the code table. The shortest code is five bits long, so a nibble
//! completes at most one symbol.

use std::sync::OnceLock;

use super::Error;

/// (code, bit length) of each symbol; 256 is EOS.
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

const EOS: u16 = 256;
const NONE: u16 = u16::MAX;

#[derive(Debug, Clone, Copy)]
struct Step {
    /// The inner node reached.
    next: u16,
    /// The symbol completed on the way, or `NONE`.
    emit: u16,
    /// The nibble ran into EOS: the string is malformed.
    fail: bool,
}

#[derive(Debug)]
struct Machine {
    steps: Vec<[Step; 16]>,
    /// Whether ending in this state is valid padding: the bits since the last symbol are all
    /// ones (a prefix of EOS) and fewer than eight.
    may_end: Vec<bool>,
}

fn machine() -> &'static Machine {
    static M: OnceLock<Machine> = OnceLock::new();
    M.get_or_init(build)
}

/// The code tree: inner nodes hold their two children, leaves are `sym | LEAF`.
fn build() -> Machine {
    const LEAF: u32 = 1 << 16;
    let mut kids: Vec<[u32; 2]> = vec![[0, 0]];
    let mut depth_ones: Vec<(u8, bool)> = vec![(0, true)];
    for (sym, &(code, len)) in CODES.iter().enumerate() {
        let mut node = 0usize;
        for i in (0..len).rev() {
            let bit = ((code >> i) & 1) as usize;
            if i == 0 {
                kids[node][bit] = sym as u32 | LEAF;
            } else if kids[node][bit] == 0 {
                kids.push([0, 0]);
                let (d, ones) = depth_ones[node];
                depth_ones.push((d + 1, ones && bit == 1));
                kids[node][bit] = (kids.len() - 1) as u32;
                node = kids.len() - 1;
            } else {
                node = kids[node][bit] as usize;
            }
        }
    }
    let mut steps = Vec::with_capacity(kids.len());
    for start in 0..kids.len() {
        let mut row = [Step {
            next: 0,
            emit: NONE,
            fail: false,
        }; 16];
        for (nibble, step) in row.iter_mut().enumerate() {
            let mut node = start;
            for i in (0..4).rev() {
                let child = kids[node][(nibble >> i) & 1];
                if child & LEAF != 0 {
                    let sym = (child & !LEAF) as u16;
                    if sym == EOS {
                        step.fail = true;
                    }
                    debug_assert_eq!(step.emit, NONE, "two symbols in one nibble");
                    step.emit = sym;
                    node = 0;
                } else {
                    node = child as usize;
                }
            }
            step.next = node as u16;
        }
        steps.push(row);
    }
    let may_end = depth_ones.iter().map(|&(d, ones)| ones && d < 8).collect();
    Machine { steps, may_end }
}

/// Appends the decoding of `src` to `out`.
pub(crate) fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    let m = machine();
    let mut state = 0usize;
    for &b in src {
        for nibble in [b >> 4, b & 0xf] {
            let s = m.steps[state][nibble as usize];
            if s.fail {
                return Err(Error::Huffman);
            }
            if s.emit != NONE {
                out.push(s.emit as u8);
            }
            state = s.next as usize;
        }
    }
    if m.may_end[state] {
        Ok(())
    } else {
        Err(Error::Huffman)
    }
}

/// The length of `src` once encoded.
pub(crate) fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| CODES[b as usize].1 as usize).sum();
    bits.div_ceil(8)
}

/// Appends the encoding of `src` to `out`, padded with the most significant bits of EOS.
pub(crate) fn encode(src: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut n: u32 = 0;
    for &b in src {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | code as u64;
        n += len as u32;
        while n >= 8 {
            n -= 8;
            out.push((acc >> n) as u8);
        }
    }
    if n > 0 {
        out.push(((acc << (8 - n)) | (0xff >> n)) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 7541, Appendix C.4 and C.6.
    #[test]
    fn rfc_examples() {
        for (text, code) in [
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
            ("302", "6402"),
            ("private", "aec3 771a 4b"),
            (
                "Mon, 21 Oct 2013 20:13:21 GMT",
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
            ),
            (
                "https://www.example.com",
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
            ),
        ] {
            let mut enc = Vec::new();
            encode(text.as_bytes(), &mut enc);
            assert_eq!(enc, hex(code), "{text}");
            assert_eq!(encoded_len(text.as_bytes()), enc.len());
            let mut dec = Vec::new();
            decode(&enc, &mut dec).unwrap();
            assert_eq!(dec, text.as_bytes());
        }
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // 'a' is 00011 (5 bits): padding of three zeros is not a prefix of EOS.
        assert_eq!(decode(&[0b0001_1000], &mut Vec::new()), Err(Error::Huffman));
        // Eight or more bits of padding.
        assert_eq!(
            decode(&[0b0001_1111, 0xff], &mut Vec::new()),
            Err(Error::Huffman)
        );
        // EOS itself (30 ones) inside the string.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xfc], &mut Vec::new()),
            Err(Error::Huffman)
        );
        // A lone padding byte of ones is eight bits of padding.
        assert_eq!(decode(&[0xff], &mut Vec::new()), Err(Error::Huffman));
        assert_eq!(decode(&[], &mut Vec::new()), Ok(()));
    }

    proptest::proptest! {
        #[test]
        fn round_trip(s in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let mut enc = Vec::new();
            encode(&s, &mut enc);
            proptest::prop_assert_eq!(enc.len(), encoded_len(&s));
            let mut dec = Vec::new();
            decode(&enc, &mut dec).unwrap();
            proptest::prop_assert_eq!(dec, s);
        }
    }
}
