//! HPACK (RFC 7541): header compression for HTTP/2.

mod decode;
mod encode;
mod huffman;
mod table;

pub(crate) use decode::Decoder;
pub(crate) use encode::Encoder;

/// A malformed header block: a connection error (COMPRESSION_ERROR) in HTTP/2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Error {
    /// An integer or string runs past the end of the block.
    Truncated,
    /// An integer too large for any table or string.
    Integer,
    /// An index naming no entry.
    Index(usize),
    /// A Huffman string with bad padding or EOS inside.
    Huffman,
    /// A table size update above the limit we announced, or after a field.
    SizeUpdate,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Truncated => f.write_str("header block truncated"),
            Error::Integer => f.write_str("integer overflow in header block"),
            Error::Index(i) => write!(f, "header index {i} names no entry"),
            Error::Huffman => f.write_str("invalid Huffman string"),
            Error::SizeUpdate => f.write_str("invalid dynamic table size update"),
        }
    }
}
