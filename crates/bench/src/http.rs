//! A lean HTTP/1.1 client for the load generator.
//!
//! The bench shares a 2-core machine with the server it measures, so the
//! hot path is kept to what a request really costs: one keep-alive
//! connection per worker, a request written from a pre-rendered buffer with
//! one `write`, the response head parsed in place by `httparse`, and the
//! body skipped (or copied out only when the caller asks for it). No
//! per-request allocation, no connection task, no channel between them.
//! The same client serves the few setup and verification requests.

use std::io;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::target::BaseUrl;

/// Initial read buffer per connection; grows only for large bodies.
const READ_BUFFER: usize = 4096;

/// Most headers a response may carry (axum sends a handful).
const MAX_HEADERS: usize = 32;

/// Longest `Retry-After` the bench honours, so a bad header cannot stall a run.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `Content-Length: n`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// No length: the body runs until the server closes the connection.
    UntilClose,
    /// No body (1xx, 204, 304).
    Empty,
}

/// The parts of a response head the bench acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ParsedHead {
    status: u16,
    head_len: usize,
    framing: Framing,
    keep_alive: bool,
    retry_after: Option<Duration>,
    /// The `Location` header (copied only when present: 201s of setup
    /// requests, never the hot path's 204s and 202s).
    location: Option<String>,
}

/// What a round trip returns: the status and what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The HTTP status code.
    pub status: u16,
    /// `Retry-After` in seconds, when the server sent one (capped).
    pub retry_after: Option<Duration>,
}

/// Parses a response head from the start of `buf`; `None` until complete.
fn parse_head(buf: &[u8]) -> io::Result<Option<ParsedHead>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad response head: {e}"),
            ))
        }
    };
    let status = response.code.unwrap_or(0);
    let http11 = response.version == Some(1);
    let mut keep_alive = http11;
    let mut length = None;
    let mut chunked = false;
    let mut retry_after = None;
    let mut location = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
            length =
                Some(v.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "bad content-length")
                })?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h
                .value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        } else if h.name.eq_ignore_ascii_case("retry-after") {
            // Delay-seconds only; an HTTP-date is rare from an API server.
            retry_after = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
        } else if h.name.eq_ignore_ascii_case("location") {
            location = Some(String::from_utf8_lossy(h.value).trim().to_string());
        }
    }
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    Ok(Some(ParsedHead {
        status,
        head_len,
        framing,
        keep_alive,
        retry_after,
        location,
    }))
}

/// Walks a chunked body at the start of `buf`. Returns the number of bytes
/// it occupies (through the final CRLF after any trailers) once complete,
/// appending the decoded data to `out` if given; `None` while incomplete.
fn parse_chunked(buf: &[u8], mut out: Option<&mut Vec<u8>>) -> io::Result<Option<usize>> {
    let bad = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad chunked body: {what}"),
        )
    };
    let mut pos = 0;
    loop {
        let Some(line_end) = find_crlf(&buf[pos..]) else {
            return Ok(None);
        };
        let line = &buf[pos..pos + line_end];
        let size_part = line
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        let size_str = std::str::from_utf8(size_part).map_err(|_| bad("size"))?;
        let size = usize::from_str_radix(size_str, 16).map_err(|_| bad("size"))?;
        pos += line_end + 2;
        if size == 0 {
            // Trailers, each ending in CRLF, then an empty line.
            loop {
                let Some(end) = find_crlf(&buf[pos..]) else {
                    return Ok(None);
                };
                pos += end + 2;
                if end == 0 {
                    return Ok(Some(pos));
                }
            }
        }
        if buf.len() < pos + size + 2 {
            return Ok(None);
        }
        if &buf[pos + size..pos + size + 2] != b"\r\n" {
            return Err(bad("missing CRLF after chunk"));
        }
        if let Some(out) = out.as_deref_mut() {
            out.extend_from_slice(&buf[pos..pos + size]);
        }
        pos += size + 2;
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// One keep-alive HTTP/1.1 connection, used by one task at a time.
///
/// Requests are sent one after another (no pipelining), which is how a
/// device or a k6 VU talks to a server.
pub struct Conn {
    stream: TcpStream,
    /// Bytes read from the socket; `buf[..len]` are not consumed yet.
    buf: Vec<u8>,
    len: usize,
    /// False once the server asked to close (or the body ran to EOF).
    reusable: bool,
    /// The last response's `Location` header.
    location: Option<String>,
}

impl Conn {
    /// Connects with `TCP_NODELAY`: requests are single writes, and Nagle
    /// would only add latency to them.
    pub async fn connect(addr: &str) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: vec![0; READ_BUFFER],
            len: 0,
            reusable: true,
            location: None,
        })
    }

    /// Whether the connection can carry another request.
    pub fn reusable(&self) -> bool {
        self.reusable
    }

    /// The `Location` header of the last response, if it had one: where a
    /// `201 Created` says the new resource lives (an NGSI subscription's id).
    pub fn location(&self) -> Option<&str> {
        self.location.as_deref()
    }

    /// Writes `request` (a complete HTTP/1.1 request) and reads the whole
    /// response. The body is appended to `body` when given, else skipped.
    pub async fn round_trip(
        &mut self,
        request: &[u8],
        mut body: Option<&mut Vec<u8>>,
    ) -> io::Result<Head> {
        self.location = None;
        self.stream.write_all(request).await?;
        let mut head = loop {
            if self.len > 0 {
                if let Some(head) = parse_head(&self.buf[..self.len])? {
                    self.consume(head.head_len);
                    if (100..200).contains(&head.status) {
                        continue; // an interim response; the real one follows
                    }
                    break head;
                }
            }
            if self.fill().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before a response",
                ));
            }
        };
        match head.framing {
            Framing::Empty => {}
            Framing::Length(n) => {
                if self.buf.len() < n {
                    self.buf.resize(n, 0);
                }
                while self.len < n {
                    if self.fill().await? == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed mid-body",
                        ));
                    }
                }
                if let Some(out) = body.as_deref_mut() {
                    out.extend_from_slice(&self.buf[..n]);
                }
                self.consume(n);
            }
            Framing::Chunked => loop {
                if let Some(n) = parse_chunked(&self.buf[..self.len], None)? {
                    if let Some(out) = body.as_deref_mut() {
                        parse_chunked(&self.buf[..n], Some(out))?;
                    }
                    self.consume(n);
                    break;
                }
                if self.fill().await? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed mid-body",
                    ));
                }
            },
            Framing::UntilClose => {
                while self.fill().await? > 0 {}
                if let Some(out) = body {
                    out.extend_from_slice(&self.buf[..self.len]);
                }
                self.len = 0;
            }
        }
        if !head.keep_alive {
            self.reusable = false;
        }
        self.location = head.location.take();
        Ok(Head {
            status: head.status,
            retry_after: head.retry_after,
        })
    }

    /// Reads more bytes, growing the buffer when it is full; 0 means EOF.
    async fn fill(&mut self) -> io::Result<usize> {
        if self.len == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self.stream.read(&mut self.buf[self.len..]).await?;
        self.len += n;
        Ok(n)
    }

    /// Drops the first `n` buffered bytes (normally all of them).
    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }
}

/// The API key every request carries (`X-Auth-Token`), set once per run
/// before any request is rendered ([`use_api_key`]). A process-wide value
/// because a bench run drives one server, and every scenario renders its
/// requests through [`render_request`].
static API_KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the API key all requests of this run carry; the first call wins.
pub fn use_api_key(key: String) {
    let _ = API_KEY.set(key);
}

/// The run's API key, if there is one.
pub fn api_key() -> Option<&'static str> {
    API_KEY.get().map(String::as_str)
}

/// What uplinks carry in `Authorization`: the ingest key given
/// (`--ingest-key`), else the run's API key as a bearer token (weft takes
/// a global admin key on its ingest paths, and wants a credential there
/// whenever keys are on).
pub fn ingest_credential(ingest_key: Option<&str>) -> Option<String> {
    ingest_key
        .map(str::to_string)
        .or_else(|| api_key().map(|key| format!("Bearer {key}")))
}

/// The run's API key as a header line (`X-Auth-Token: …\r\n`), for the
/// scenarios that pre-render their request heads by hand; empty without one.
pub fn api_key_line() -> String {
    api_key().map_or_else(String::new, |key| format!("X-Auth-Token: {key}\r\n"))
}

/// Renders a complete request with an optional JSON body (and the run's
/// API key, [`use_api_key`]).
pub fn render_request(
    method: &str,
    target: &str,
    host: &str,
    headers: &[(&str, &str)],
    json: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + json.map_or(0, <[u8]>::len));
    out.extend_from_slice(format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n").as_bytes());
    for (name, value) in headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    if let Some(key) = api_key() {
        out.extend_from_slice(format!("X-Auth-Token: {key}\r\n").as_bytes());
    }
    match json {
        Some(body) => {
            out.extend_from_slice(
                format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(body);
        }
        None => out.extend_from_slice(b"\r\n"),
    }
    out
}

/// A response to a one-off request: status and body.
#[derive(Debug)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// The whole body.
    pub body: Vec<u8>,
    /// The `Location` header, when there was one.
    pub location: Option<String>,
}

impl Response {
    /// The body as text, for error messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a fresh connection: for setup and verification,
/// not for load. `timeout` bounds connect and response together.
pub async fn request(
    base: &BaseUrl,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    json: Option<&[u8]>,
    timeout: Duration,
) -> anyhow::Result<Response> {
    let target = base.path(path);
    let request = render_request(method, &target, &base.host, headers, json);
    let exchange = async {
        let mut conn = Conn::connect(&base.connect)
            .await
            .with_context(|| format!("connecting to {base}"))?;
        let mut body = Vec::new();
        let head = conn
            .round_trip(&request, Some(&mut body))
            .await
            .with_context(|| format!("{method} {target}"))?;
        Ok::<_, anyhow::Error>(Response {
            status: head.status,
            body,
            location: conn.location.take(),
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => bail!(
            "{method} {target}: no response within {}",
            humantime::format_duration(timeout)
        ),
    }
}

/// Percent-encodes a query parameter value (everything but RFC 3986's
/// unreserved characters), for opaque cursors and names.
pub fn encode_query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `PUT`s a JSON body for setup and fails unless the server answers 200
/// or 201; `what` names the step in the error.
pub async fn put_setup(base: &BaseUrl, path: &str, json: &[u8], what: &str) -> anyhow::Result<()> {
    let response = request(base, "PUT", path, &[], Some(json), Duration::from_secs(30)).await?;
    if !matches!(response.status, 200 | 201) {
        bail!(
            "{what}: PUT {path} answered {}: {}",
            response.status,
            response.text().trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_with_length_and_keep_alive() {
        let raw = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let h = parse_head(raw).unwrap().unwrap();
        assert_eq!(h.status, 202);
        assert_eq!(h.head_len, raw.len());
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.keep_alive);
        assert_eq!(h.retry_after, None);
        assert_eq!(h.location, None);
        assert_eq!(parse_head(&raw[..20]).unwrap(), None);
        let raw = b"HTTP/1.1 201 Created\r\nLocation: /v2/subscriptions/abc \r\nContent-Length: 0\r\n\r\n";
        let h = parse_head(raw).unwrap().unwrap();
        assert_eq!(h.location.as_deref(), Some("/v2/subscriptions/abc"));
    }

    #[test]
    fn head_with_overload_hints() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nConnection: close\r\nContent-Length: 5\r\n\r\nbusy!";
        let h = parse_head(raw).unwrap().unwrap();
        assert_eq!(h.status, 503);
        assert_eq!(h.retry_after, Some(Duration::from_secs(2)));
        assert!(!h.keep_alive);
        assert_eq!(h.framing, Framing::Length(5));
        let raw = b"HTTP/1.1 429 Too Many\r\nretry-after: 99999\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            parse_head(raw).unwrap().unwrap().retry_after,
            Some(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn head_framings() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        let h = parse_head(b"HTTP/1.1 204 No Content\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Empty);
        let h = parse_head(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive);
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn chunked_bodies() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\nNEXT";
        let mut out = Vec::new();
        assert_eq!(
            parse_chunked(raw, Some(&mut out)).unwrap(),
            Some(raw.len() - 4)
        );
        assert_eq!(out, b"hello, world");
        // Incomplete at every cut.
        for cut in 0..raw.len() - 4 {
            assert_eq!(
                parse_chunked(&raw[..cut], None).unwrap(),
                None,
                "cut at {cut}"
            );
        }
        let with_trailer = b"0\r\nX-T: 1\r\n\r\n";
        assert_eq!(
            parse_chunked(with_trailer, None).unwrap(),
            Some(with_trailer.len())
        );
        assert!(parse_chunked(b"zz\r\n", None).is_err());
        assert!(parse_chunked(b"2\r\nabXX", None).is_err());
    }

    #[test]
    fn renders_requests() {
        let r = render_request("PUT", "/a", "h:1", &[("Authorization", "k")], Some(b"{}"));
        assert_eq!(
            r,
            b"PUT /a HTTP/1.1\r\nHost: h:1\r\nAuthorization: k\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
        assert_eq!(
            render_request("GET", "/", "h", &[], None),
            b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
        );
    }

    #[test]
    fn encodes_query_values() {
        assert_eq!(encode_query_value("abc-1_2.~"), "abc-1_2.~");
        assert_eq!(encode_query_value("a b+/="), "a%20b%2B%2F%3D");
    }

    /// A full exchange against a scripted local socket: a keep-alive
    /// response, then a chunked one split across writes, on one connection.
    #[tokio::test]
    async fn round_trips_on_one_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"POST /x HTTP/1.1\r\n"));
            s.write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            s.write_all(b"c\r\n0\r\n\r\n").await.unwrap();
        });
        let mut conn = Conn::connect(&addr).await.unwrap();
        let req = render_request("POST", "/x", "h", &[], Some(b"{}"));
        let head = conn.round_trip(&req, None).await.unwrap();
        assert_eq!(head.status, 202);
        assert!(conn.reusable());
        let mut body = Vec::new();
        let req = render_request("GET", "/y", "h", &[], None);
        let head = conn.round_trip(&req, Some(&mut body)).await.unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(body, b"abc");
        server.await.unwrap();
    }
}
