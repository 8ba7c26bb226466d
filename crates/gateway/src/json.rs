//! A request body read as etcd's gateway reads it, so that one it refuses gets etcd's words:
//! grpc-gateway takes the first JSON value of the body with Go's `encoding/json` (whose syntax
//! errors read "invalid character 'x' looking for beginning of value", "unexpected EOF"…; what
//! follows the value is not read), then hands it to protobuf's `protojson` with unknown fields
//! discarded (whose errors read "proto: (line 1:9): invalid value for bytes field key: 5").
//!
//! [`read`] does both against the message's schema (`api::schema`) and returns the value
//! rewritten as the serde impls take it: unknown fields, `null`s and enum names the schema
//! does not know left out (protojson discards them), integers written with a fraction or an
//! exponent (`1e2`) as plain integers.

use api::schema::{self, Field, Kind};
use base64::Engine;

/// Reads the request of message `full_name` (`.etcdserverpb.RangeRequest`) from `body`: its
/// JSON rewritten for serde, or the message etcd's gateway refuses it with.
pub(crate) fn read(body: &[u8], full_name: &str) -> Result<String, String> {
    let value = first_value(body)?;
    let mut r = Reader { b: value, i: 0 };
    let mut out = String::with_capacity(value.len());
    r.message(full_name, &mut out)?;
    Ok(out)
}

// ---- Go's encoding/json: the first value, or its syntax error ----------------------------

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// How Go quotes the byte in a syntax error.
fn quote(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_owned(),
        b'"' => "'\"'".to_owned(),
        0x20..=0x7e => format!("'{}'", c as char),
        _ => format!("{:?}", char::from(c)).replace('\'', "\""),
    }
}

fn invalid(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", quote(c))
}

const EOF: &str = "unexpected EOF";

/// The first JSON value of `b` (leading space skipped), checked as Go's decoder checks it.
fn first_value(b: &[u8]) -> Result<&[u8], String> {
    let mut s = Syntax { b, i: 0 };
    s.space();
    let start = s.i;
    s.value()?;
    Ok(&b[start..s.i])
}

struct Syntax<'a> {
    b: &'a [u8],
    i: usize,
}

impl Syntax<'_> {
    fn space(&mut self) {
        while self.b.get(self.i).is_some_and(|&c| is_space(c)) {
            self.i += 1;
        }
    }

    fn next(&mut self) -> Result<u8, String> {
        let c = *self.b.get(self.i).ok_or(EOF)?;
        self.i += 1;
        Ok(c)
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn value(&mut self) -> Result<(), String> {
        match self.next()? {
            b'{' => self.object(),
            b'[' => self.array(),
            b'"' => self.string(),
            c @ (b'-' | b'0'..=b'9') => self.number(c),
            b't' => self.literal(b"rue", "true"),
            b'f' => self.literal(b"alse", "false"),
            b'n' => self.literal(b"ull", "null"),
            c => Err(invalid(c, "looking for beginning of value")),
        }
    }

    fn object(&mut self) -> Result<(), String> {
        self.space();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.space();
            match self.next()? {
                b'"' => self.string()?,
                c => return Err(invalid(c, "looking for beginning of object key string")),
            }
            self.space();
            match self.next()? {
                b':' => {}
                c => return Err(invalid(c, "after object key")),
            }
            self.space();
            self.value()?;
            self.space();
            match self.next()? {
                b',' => {}
                b'}' => return Ok(()),
                c => return Err(invalid(c, "after object key:value pair")),
            }
        }
    }

    fn array(&mut self) -> Result<(), String> {
        self.space();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.space();
            self.value()?;
            self.space();
            match self.next()? {
                b',' => {}
                b']' => return Ok(()),
                c => return Err(invalid(c, "after array element")),
            }
        }
    }

    /// After the opening quote.
    fn string(&mut self) -> Result<(), String> {
        loop {
            match self.next()? {
                b'"' => return Ok(()),
                b'\\' => match self.next()? {
                    b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {}
                    b'u' => {
                        for _ in 0..4 {
                            let c = self.next()?;
                            if !c.is_ascii_hexdigit() {
                                return Err(invalid(c, "in \\u hexadecimal character escape"));
                            }
                        }
                    }
                    c => return Err(invalid(c, "in string escape code")),
                },
                c if c < 0x20 => return Err(invalid(c, "in string literal")),
                _ => {}
            }
        }
    }

    /// After the first character. A number at the end of the body ends there.
    fn number(&mut self, first: u8) -> Result<(), String> {
        let mut c = first;
        if c == b'-' {
            c = self.next()?;
            if !c.is_ascii_digit() {
                return Err(invalid(c, "in numeric literal"));
            }
        }
        if c != b'0' {
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            let c = self.next()?;
            if !c.is_ascii_digit() {
                return Err(invalid(c, "after decimal point in numeric literal"));
            }
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            let mut c = self.next()?;
            if c == b'+' || c == b'-' {
                c = self.next()?;
            }
            if !c.is_ascii_digit() {
                return Err(invalid(c, "in exponent of numeric literal"));
            }
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
        }
        Ok(())
    }

    fn literal(&mut self, rest: &[u8], name: &str) -> Result<(), String> {
        for &want in rest {
            let c = self.next()?;
            if c != want {
                let context = format!("in literal {name} (expecting {})", quote(want));
                return Err(invalid(c, &context));
            }
        }
        Ok(())
    }
}

// ---- protojson: the value against the message's schema -----------------------------------

/// A token of a value already known to be well-formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    ObjectOpen,
    ArrayOpen,
    String,
    Number,
    Bool,
    Null,
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn space(&mut self) {
        while self.b.get(self.i).is_some_and(|&c| is_space(c)) {
            self.i += 1;
        }
    }

    /// The next token's kind and start (after space), not consumed.
    fn peek(&mut self) -> (Tok, usize) {
        self.space();
        let t = match self.b.get(self.i) {
            Some(b'{') => Tok::ObjectOpen,
            Some(b'[') => Tok::ArrayOpen,
            Some(b'"') => Tok::String,
            Some(b't' | b'f') => Tok::Bool,
            Some(b'n') => Tok::Null,
            _ => Tok::Number,
        };
        (t, self.i)
    }

    /// Consumes a scalar token or a whole object or array: its raw text.
    fn skip(&mut self) -> &'a [u8] {
        self.space();
        let start = self.i;
        let mut s = Syntax {
            b: self.b,
            i: self.i,
        };
        // Well-formed: the syntax pass already read it.
        let _ = s.value();
        self.i = s.i;
        &self.b[start..self.i]
    }

    /// Consumes `c` (after space).
    fn eat(&mut self, c: u8) -> bool {
        self.space();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            return true;
        }
        false
    }

    /// The raw text of the token at `at`, as protojson shows it in errors (an object or
    /// array by its opening character).
    fn raw_at(&self, at: usize) -> String {
        match self.b[at] {
            b'{' | b'[' => (self.b[at] as char).to_string(),
            _ => {
                let mut s = Reader { b: self.b, i: at };
                String::from_utf8_lossy(s.skip()).into_owned()
            }
        }
    }

    /// protojson's position: line and byte column, from 1.
    fn pos(&self, at: usize) -> String {
        let before = &self.b[..at];
        let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
        let col = at
            - before
                .iter()
                .rposition(|&c| c == b'\n')
                .map_or(0, |p| p + 1)
            + 1;
        format!("line {line}:{col}")
    }

    fn error(&self, at: usize, msg: impl std::fmt::Display) -> String {
        format!("proto: ({}): {msg}", self.pos(at))
    }

    fn unexpected(&self, at: usize) -> String {
        format!(
            "proto: syntax error ({}): unexpected token {}",
            self.pos(at),
            self.raw_at(at)
        )
    }

    /// A message: an object whose fields are checked against `full_name`'s schema.
    fn message(&mut self, full_name: &str, out: &mut String) -> Result<(), String> {
        let (tok, at) = self.peek();
        if tok != Tok::ObjectOpen {
            return Err(self.unexpected(at));
        }
        let fields = schema::message(full_name).unwrap_or_default();
        self.eat(b'{');
        out.push('{');
        let mut seen: Vec<&str> = Vec::new();
        let mut oneofs: Vec<&str> = Vec::new();
        let mut first = true;
        while !self.eat(b'}') {
            self.eat(b',');
            let (_, key_at) = self.peek();
            let key_raw = self.skip();
            let key: String = serde_json::from_slice(key_raw).unwrap_or_default();
            self.eat(b':');
            let Some(f) = fields.iter().find(|f| f.name == key || f.json_name == key) else {
                // Unknown: discarded.
                self.skip();
                continue;
            };
            if seen.contains(&f.name) {
                return Err(self.error(
                    key_at,
                    format_args!("duplicate field {}", String::from_utf8_lossy(key_raw)),
                ));
            }
            seen.push(f.name);
            if self.peek().0 == Tok::Null {
                // Unset.
                self.skip();
                continue;
            }
            if let Some(o) = f.oneof {
                if oneofs.contains(&o) {
                    let owner = full_name.trim_start_matches('.');
                    return Err(self.error(
                        key_at,
                        format_args!(
                            "error parsing {}, oneof {owner}.{o} is already set",
                            String::from_utf8_lossy(key_raw)
                        ),
                    ));
                }
                oneofs.push(o);
            }
            let mut value = String::new();
            let keep = if f.repeated {
                self.list(f, &mut value)?
            } else {
                self.field(f, &mut value)?
            };
            if keep {
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(&serde_json::to_string(f.name).unwrap_or_default());
                out.push(':');
                out.push_str(&value);
            }
        }
        out.push('}');
        Ok(())
    }

    fn list(&mut self, f: &Field, out: &mut String) -> Result<bool, String> {
        let (tok, at) = self.peek();
        if tok != Tok::ArrayOpen {
            return Err(self.unexpected(at));
        }
        self.eat(b'[');
        out.push('[');
        let mut first = true;
        while !self.eat(b']') {
            self.eat(b',');
            let mut item = String::new();
            if self.field(f, &mut item)? {
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(&item);
            }
        }
        out.push(']');
        Ok(true)
    }

    /// One value of field `f` (an element, for a list); false when protojson leaves it out
    /// (an enum name it does not know).
    fn field(&mut self, f: &Field, out: &mut String) -> Result<bool, String> {
        if f.kind == Kind::Message {
            self.message(f.type_name, out)?;
            return Ok(true);
        }
        let (tok, at) = self.peek();
        let raw = self.skip();
        let bad = || {
            self.error(
                at,
                format_args!(
                    "invalid value for {} field {}: {}",
                    kind_name(f.kind),
                    f.json_name,
                    self.raw_at(at)
                ),
            )
        };
        let text = || String::from_utf8_lossy(raw).into_owned();
        let string = || serde_json::from_slice::<String>(raw).map_err(|_| bad());
        match f.kind {
            Kind::Bool if tok == Tok::Bool => out.push_str(&text()),
            Kind::String if tok == Tok::String => out.push_str(&text()),
            Kind::Bytes if tok == Tok::String => {
                base64_bytes(&string()?).ok_or_else(bad)?;
                out.push_str(&text());
            }
            Kind::Int32 | Kind::Int64 | Kind::Uint32 | Kind::Uint64 => {
                let n = match tok {
                    Tok::Number => integer(raw, f.kind),
                    Tok::String => integer(string()?.as_bytes(), f.kind),
                    _ => None,
                };
                out.push_str(&n.ok_or_else(bad)?.to_string());
            }
            Kind::Float | Kind::Double => {
                let ok = match tok {
                    Tok::Number => float(raw, f.kind),
                    Tok::String => {
                        let s = string()?;
                        matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity")
                            || float(s.as_bytes(), f.kind)
                    }
                    _ => false,
                };
                if !ok {
                    return Err(bad());
                }
                out.push_str(&text());
            }
            Kind::Enum => {
                let values = schema::enum_values(f.type_name);
                match tok {
                    Tok::String => {
                        let name = string()?;
                        if !values.iter().any(|(n, _)| *n == name) {
                            // Unknown names are discarded, as unknown fields are.
                            return Ok(false);
                        }
                        out.push_str(&text());
                    }
                    Tok::Number => {
                        let n = integer(raw, Kind::Int32).ok_or_else(bad)?;
                        // By name: the serde impls take a number only if the enum has it
                        // (protojson keeps any number: see docs/server.md).
                        match values.iter().find(|(_, v)| i128::from(*v) == n) {
                            Some((name, _)) => out.push_str(&format!("{name:?}")),
                            None => out.push_str(&n.to_string()),
                        }
                    }
                    _ => return Err(bad()),
                }
            }
            _ => return Err(bad()),
        }
        Ok(true)
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Bool => "bool",
        Kind::Int32 => "int32",
        Kind::Int64 => "int64",
        Kind::Uint32 => "uint32",
        Kind::Uint64 => "uint64",
        Kind::Float => "float",
        Kind::Double => "double",
        Kind::String => "string",
        Kind::Bytes => "bytes",
        Kind::Enum => "enum",
        Kind::Message => "message",
    }
}

/// Base64 as protojson takes it: standard or URL-safe alphabet, padded or not.
fn base64_bytes(s: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let url = s.contains(['-', '_']);
    let padded = s.len().is_multiple_of(4);
    let engine = match (url, padded) {
        (false, true) => &STANDARD,
        (false, false) => &STANDARD_NO_PAD,
        (true, true) => &URL_SAFE,
        (true, false) => &URL_SAFE_NO_PAD,
    };
    engine.decode(s).ok()
}

/// A JSON number (its text) as an integer of `kind`, if it is one: protojson takes a fraction
/// or an exponent when the value is whole (`1.0`, `1e2`), and nothing out of range.
fn integer(raw: &[u8], kind: Kind) -> Option<i128> {
    let s = std::str::from_utf8(raw).ok()?;
    // Well-formed JSON number syntax, as protojson parses a number in a string too.
    let mut check = Syntax { b: raw, i: 0 };
    let first = check.next().ok()?;
    if !(first == b'-' || first.is_ascii_digit()) || check.number(first).is_err() {
        return None;
    }
    if check.i != raw.len() {
        return None;
    }
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(e) => (&s[..e], s[e + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (neg, digits) = match mantissa.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, mantissa),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let mut all: String = format!("{int}{frac}");
    let mut exp = exp - frac.len() as i32;
    while exp < 0 {
        // The dropped digit must be 0 for the value to be whole.
        if all.pop()? != '0' {
            return None;
        }
        exp += 1;
    }
    if exp > 40 {
        return None;
    }
    all.extend(std::iter::repeat_n('0', exp as usize));
    let trimmed = all.trim_start_matches('0');
    if trimmed.len() > 38 {
        return None;
    }
    let magnitude: i128 = if trimmed.is_empty() {
        0
    } else {
        trimmed.parse().ok()?
    };
    let n = if neg { -magnitude } else { magnitude };
    let (lo, hi) = match kind {
        Kind::Int32 => (i32::MIN as i128, i32::MAX as i128),
        Kind::Int64 => (i64::MIN as i128, i64::MAX as i128),
        Kind::Uint32 => (0, u32::MAX as i128),
        _ => (0, u64::MAX as i128),
    };
    (lo..=hi).contains(&n).then_some(n)
}

/// Whether a JSON number (its text) is a finite `kind` (float or double).
fn float(raw: &[u8], kind: Kind) -> bool {
    let Ok(v) = std::str::from_utf8(raw).unwrap_or("x").parse::<f64>() else {
        return false;
    };
    v.is_finite() && (kind == Kind::Double || v.abs() <= f32::MAX as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        read(body.as_bytes(), ".etcdserverpb.RangeRequest").unwrap_err()
    }

    fn txn_err(body: &str) -> String {
        read(body.as_bytes(), ".etcdserverpb.TxnRequest").unwrap_err()
    }

    /// What etcd 3.6.5's gateway answered these bodies on this machine.
    #[test]
    fn refusals_read_as_etcds() {
        assert_eq!(
            err("not json"),
            "invalid character 'o' in literal null (expecting 'u')"
        );
        assert_eq!(err("{"), "unexpected EOF");
        assert_eq!(err("nul"), "unexpected EOF");
        assert_eq!(
            err("  x"),
            "invalid character 'x' looking for beginning of value"
        );
        assert_eq!(
            err(r#"{"key":"YQ==",}"#),
            "invalid character '}' looking for beginning of object key string"
        );
        assert_eq!(
            err(r#"{"key" "YQ=="}"#),
            "invalid character '\"' after object key"
        );
        assert_eq!(
            err("{key:1}"),
            "invalid character 'k' looking for beginning of object key string"
        );
        assert_eq!(
            err(r#"{"key": 5}"#),
            "proto: (line 1:9): invalid value for bytes field key: 5"
        );
        assert_eq!(
            err(r#"{"key":"!!!"}"#),
            r#"proto: (line 1:8): invalid value for bytes field key: "!!!""#
        );
        assert_eq!(
            err(r#"{"key":"YQ==","limit":"x"}"#),
            r#"proto: (line 1:23): invalid value for int64 field limit: "x""#
        );
        assert_eq!(
            err("[]"),
            "proto: syntax error (line 1:1): unexpected token ["
        );
        assert_eq!(
            err(r#""str""#),
            r#"proto: syntax error (line 1:1): unexpected token "str""#
        );
        assert_eq!(
            err(r#"{"key":"YQ==","sort_order":{}}"#),
            "proto: (line 1:28): invalid value for enum field sortOrder: {"
        );
        assert_eq!(
            err(r#"{"key":"YQ==","sortOrder":true}"#),
            "proto: (line 1:27): invalid value for enum field sortOrder: true"
        );
        assert_eq!(
            err(r#"{"key":"YQ==","keys_only":"true"}"#),
            r#"proto: (line 1:27): invalid value for bool field keysOnly: "true""#
        );
        assert_eq!(
            err(r#"{"key":"YQ==","key":"YQ=="}"#),
            r#"proto: (line 1:15): duplicate field "key""#
        );
        assert_eq!(
            err(r#"{"key":"YQ==","revision":1.5}"#),
            "proto: (line 1:26): invalid value for int64 field revision: 1.5"
        );
        assert_eq!(
            err(r#"{"key":"YQ==","revision":99999999999999999999}"#),
            "proto: (line 1:26): invalid value for int64 field revision: 99999999999999999999"
        );
        assert_eq!(
            txn_err(r#"{"compare":{}}"#),
            "proto: syntax error (line 1:12): unexpected token {"
        );
        assert_eq!(
            txn_err(r#"{"compare":[{"key":5}]}"#),
            "proto: (line 1:20): invalid value for bytes field key: 5"
        );
        assert_eq!(
            txn_err(r#"{"success":[{"request_put":{"key":"YQ==","value":7}}]}"#),
            "proto: (line 1:50): invalid value for bytes field value: 7"
        );
    }

    /// And these it took.
    #[test]
    fn what_etcd_takes_is_rewritten_for_serde() {
        let ok = |b: &str| read(b.as_bytes(), ".etcdserverpb.RangeRequest").unwrap();
        assert_eq!(ok(r#"{"key":"YQ==","limit":null}"#), r#"{"key":"YQ=="}"#);
        assert_eq!(
            ok(r#"{"key":"YQ==","limit":1e2}"#),
            r#"{"key":"YQ==","limit":100}"#
        );
        assert_eq!(
            ok(r#"{"key":"YQ==","revision":"12"}"#),
            r#"{"key":"YQ==","revision":12}"#
        );
        assert_eq!(ok(r#"{"key":"YQ=="} x"#), r#"{"key":"YQ=="}"#);
        assert_eq!(ok(r#"{"sort_order":"BAD","nosuch":[1,{}]}"#), "{}");
        assert_eq!(ok(r#"{"sortOrder":1}"#), r#"{"sort_order":"ASCEND"}"#);
        assert_eq!(ok(r#"{"key":"YQ"}"#), r#"{"key":"YQ"}"#);
        let txn = read(
            br#"{"compare":[{"target":"NOPE","key":"YQ=="}]}"#,
            ".etcdserverpb.TxnRequest",
        )
        .unwrap();
        assert_eq!(txn, r#"{"compare":[{"key":"YQ=="}]}"#);
    }

    #[test]
    fn a_oneof_set_twice_is_refused() {
        let e = read(
            br#"{"request_put":{"key":"YQ=="},"request_range":{}}"#,
            ".etcdserverpb.RequestOp",
        )
        .unwrap_err();
        assert_eq!(
            e,
            r#"proto: (line 1:31): error parsing "request_range", oneof etcdserverpb.RequestOp.request is already set"#
        );
    }
}
