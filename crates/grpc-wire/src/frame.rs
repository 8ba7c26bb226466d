//! HTTP/2 frames (RFC 9113, section 4 and 6): the nine-byte header, the types and flags a
//! server reads, and the frames it writes.

/// What a client sends first (RFC 9113, 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub(crate) const HEAD_LEN: usize = 9;

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const PRIORITY: u8 = 0x2;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PUSH_PROMISE: u8 = 0x5;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY_FLAG: u8 = 0x20;

pub(crate) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(crate) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(crate) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(crate) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(crate) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(crate) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The frame size every peer accepts until its SETTINGS say more (and the least it may say).
pub(crate) const DEFAULT_MAX_FRAME: usize = 16_384;
/// The largest frame size a peer may announce.
pub(crate) const MAX_MAX_FRAME: usize = (1 << 24) - 1;
/// Every window starts here (RFC 9113, 6.9.2).
pub(crate) const DEFAULT_WINDOW: i64 = 65_535;
/// No window may exceed this.
pub(crate) const MAX_WINDOW: i64 = (1 << 31) - 1;

/// An HTTP/2 error code (RFC 9113, section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub u32);

impl Reason {
    pub const NO_ERROR: Reason = Reason(0x0);
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    pub const CANCEL: Reason = Reason(0x8);
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            0x0 => "NO_ERROR",
            0x1 => "PROTOCOL_ERROR",
            0x2 => "INTERNAL_ERROR",
            0x3 => "FLOW_CONTROL_ERROR",
            0x4 => "SETTINGS_TIMEOUT",
            0x5 => "STREAM_CLOSED",
            0x6 => "FRAME_SIZE_ERROR",
            0x7 => "REFUSED_STREAM",
            0x8 => "CANCEL",
            0x9 => "COMPRESSION_ERROR",
            0xa => "CONNECT_ERROR",
            0xb => "ENHANCE_YOUR_CALM",
            0xc => "INADEQUATE_SECURITY",
            0xd => "HTTP_1_1_REQUIRED",
            n => return write!(f, "error code {n:#x}"),
        };
        f.write_str(name)
    }
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) len: usize,
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) stream: u32,
}

impl Head {
    pub(crate) fn parse(b: &[u8]) -> Head {
        Head {
            len: (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize,
            kind: b[3],
            flags: b[4],
            // The reserved high bit is ignored on receipt.
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

pub(crate) fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Appends a frame header.
pub(crate) fn head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len <= MAX_MAX_FRAME);
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// Appends a frame header whose length is filled in by [`finish`] once the payload is written.
pub(crate) fn begin(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32) -> usize {
    let at = out.len();
    head(out, 0, kind, flags, stream);
    at
}

/// Writes the payload length into the header that [`begin`] put at `at`.
pub(crate) fn finish(out: &mut [u8], at: usize) {
    let len = out.len() - at - HEAD_LEN;
    debug_assert!(len <= MAX_MAX_FRAME);
    out[at..at + 3].copy_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
}

pub(crate) fn settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    head(out, params.len() * 6, SETTINGS, 0, 0);
    for &(id, v) in params {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&v.to_be_bytes());
    }
}

pub(crate) fn settings_ack(out: &mut Vec<u8>) {
    head(out, 0, SETTINGS, ACK, 0);
}

pub(crate) fn ping_ack(out: &mut Vec<u8>, payload: &[u8]) {
    head(out, 8, PING, ACK, 0);
    out.extend_from_slice(payload);
}

pub(crate) fn window_update(out: &mut Vec<u8>, stream: u32, inc: u32) {
    head(out, 4, WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&inc.to_be_bytes());
}

pub(crate) fn rst_stream(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    head(out, 4, RST_STREAM, 0, stream);
    out.extend_from_slice(&reason.0.to_be_bytes());
}

pub(crate) fn goaway(out: &mut Vec<u8>, last: u32, reason: Reason, debug: &str) {
    head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.extend_from_slice(&last.to_be_bytes());
    out.extend_from_slice(&reason.0.to_be_bytes());
    out.extend_from_slice(debug.as_bytes());
}

/// The payload of a DATA or HEADERS frame without its padding: `Err` when the pad length
/// does not fit the frame (a connection error, RFC 9113 6.1).
pub(crate) fn unpad(h: &Head, payload: &[u8]) -> Result<(usize, usize), Reason> {
    if !h.has(PADDED) {
        return Ok((0, payload.len()));
    }
    let pad = *payload.first().ok_or(Reason::FRAME_SIZE_ERROR)? as usize;
    if pad >= payload.len() {
        return Err(Reason::PROTOCOL_ERROR);
    }
    Ok((1, payload.len() - pad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let mut out = Vec::new();
        head(
            &mut out,
            0x12_3456,
            HEADERS,
            END_HEADERS | END_STREAM,
            0x7fff_ffff,
        );
        let h = Head::parse(&out);
        assert_eq!(
            h,
            Head {
                len: 0x12_3456,
                kind: HEADERS,
                flags: END_HEADERS | END_STREAM,
                stream: 0x7fff_ffff
            }
        );
        // The reserved bit is dropped.
        out[5] |= 0x80;
        assert_eq!(Head::parse(&out).stream, 0x7fff_ffff);
    }

    #[test]
    fn begin_finish_fills_the_length() {
        let mut out = vec![1, 2, 3];
        let at = begin(&mut out, DATA, 0, 3);
        out.extend_from_slice(b"hello");
        finish(&mut out, at);
        assert_eq!(Head::parse(&out[at..]).len, 5);
    }

    #[test]
    fn padding() {
        let plain = Head::parse(&[0, 0, 3, DATA, 0, 0, 0, 0, 1]);
        assert_eq!(unpad(&plain, b"abc"), Ok((0, 3)));
        let padded = Head {
            flags: PADDED,
            ..plain
        };
        assert_eq!(unpad(&padded, &[2, b'a', 0, 0]), Ok((1, 2)));
        assert_eq!(unpad(&padded, &[3, b'a', 0, 0]), Ok((1, 1)));
        assert_eq!(
            unpad(&padded, &[4, b'a', 0, 0]),
            Err(Reason::PROTOCOL_ERROR)
        );
        assert_eq!(unpad(&padded, &[]), Err(Reason::FRAME_SIZE_ERROR));
    }
}
