//! Test builds only (`--features failpoints`): failpoints changed while the member runs, as
//! etcd's gofail endpoint (`GOFAIL_HTTP`). With `FAILPOINTS_HTTP=127.0.0.1:PORT` the member
//! serves, on that address, plain HTTP/1.1:
//!
//! - `PUT /NAME` with an action as the body (the `fail` crate's: `sleep(3000)`, `1*sleep(3000)`,
//!   `panic`, `off`, …) arms failpoint NAME;
//! - `DELETE /NAME` disarms it;
//! - `GET /` lists the armed ones, one `NAME=ACTION` a line.
//!
//! Tests use it to stall one member at a chosen moment (a failpoint armed from `FAILPOINTS`
//! at start counts passes from the start, which a test cannot time).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

/// The most bytes of a request's body (an action is a few words).
const MAX_BODY: usize = 4096;

/// Serves the endpoint on a thread of its own if `FAILPOINTS_HTTP` names an address.
pub fn serve_from_env() -> Result<(), String> {
    let Ok(addr) = std::env::var("FAILPOINTS_HTTP") else {
        return Ok(());
    };
    let listener = TcpListener::bind(&addr).map_err(|e| format!("FAILPOINTS_HTTP {addr}: {e}"))?;
    tracing::warn!(%addr, "failpoints can be changed over HTTP (a test build)");
    std::thread::Builder::new()
        .name("failpoints-http".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                if let Err(e) = answer(conn) {
                    tracing::warn!("failpoints endpoint: {e}");
                }
            }
        })
        .map_err(|e| format!("failpoints endpoint thread: {e}"))?;
    Ok(())
}

/// Reads one request and answers it; the connection is closed after.
fn answer(conn: TcpStream) -> std::io::Result<()> {
    // A client that sends nothing holds the endpoint no longer than this.
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut r = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut len = 0;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let (code, text) = if len > MAX_BODY {
        ("413 Payload Too Large", "body too large\n".to_string())
    } else {
        let mut body = vec![0; len];
        r.read_exact(&mut body)?;
        respond(method, path.trim_start_matches('/'), &body)
    };
    let mut w = conn;
    write!(
        w,
        "HTTP/1.1 {code}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    w.flush()
}

/// The status line's code and the body for one request.
fn respond(method: &str, name: &str, body: &[u8]) -> (&'static str, String) {
    match (method, name) {
        ("GET", "") => {
            let list: String = fail::list()
                .into_iter()
                .map(|(n, a)| format!("{n}={a}\n"))
                .collect();
            ("200 OK", list)
        }
        ("PUT", n) if !n.is_empty() => {
            let action = String::from_utf8_lossy(body);
            match fail::cfg(n, action.trim()) {
                Ok(()) => {
                    tracing::warn!(failpoint = n, action = %action.trim(), "failpoint armed");
                    ("204 No Content", String::new())
                }
                Err(e) => ("400 Bad Request", format!("{e}\n")),
            }
        }
        ("DELETE", n) if !n.is_empty() => {
            fail::remove(n);
            ("204 No Content", String::new())
        }
        _ => (
            "405 Method Not Allowed",
            "PUT or DELETE /NAME, or GET /\n".into(),
        ),
    }
}
