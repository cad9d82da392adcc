//! Percent-encodes the bytes that HTTP forbids in a request target but that
//! Orion's clients send raw (`GET /v2/entities?q=temperature>40`,
//! `…?q=name=="x"`): Orion accepts them, hyper refuses such a request
//! before weft sees it. This wraps a connection and rewrites only the
//! request-target of each request line; headers, bodies and everything
//! after a protocol upgrade (websockets) pass through untouched.
//!
//! To know where request lines are, it follows the requests on the
//! connection: request line, headers up to the empty line, then
//! `Content-Length` bytes of body. A chunked request body or an
//! `Upgrade` request switches it to plain pass-through for the rest of the
//! connection (weft's clients don't send chunked requests and then more
//! requests on the same connection; if one does, its later request lines
//! are simply not rewritten).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Longest header line looked at for `Content-Length`, `Transfer-Encoding`
/// and `Upgrade`; longer lines are passed on without being inspected.
const MAX_HEADER_LINE: usize = 8 * 1024;

/// Where in the request stream the next byte is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Method, before the first space.
    Method,
    /// The request target, up to the next space.
    Target,
    /// The rest of the request line (the HTTP version).
    Version,
    /// Header lines.
    Headers,
    /// This many body bytes still to pass.
    Body(u64),
    /// Pass everything from here on.
    Passthrough,
}

/// Request-target rewriting over a byte stream, kept apart from I/O so it
/// can be tested on its own.
#[derive(Debug)]
struct Rewriter {
    state: State,
    line: Vec<u8>,
    content_length: u64,
    passthrough_after_headers: bool,
}

impl Rewriter {
    fn new() -> Self {
        Rewriter {
            state: State::Method,
            line: Vec::new(),
            content_length: 0,
            passthrough_after_headers: false,
        }
    }

    /// Appends `input`, rewritten, to `out`.
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut i = 0;
        while i < input.len() {
            match self.state {
                State::Passthrough => {
                    out.extend_from_slice(&input[i..]);
                    return;
                }
                State::Body(left) => {
                    let take = (left.min((input.len() - i) as u64)) as usize;
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    self.state = if left == take as u64 {
                        State::Method
                    } else {
                        State::Body(left - take as u64)
                    };
                }
                State::Method => {
                    let b = input[i];
                    out.push(b);
                    if b == b' ' {
                        self.state = State::Target;
                    }
                    i += 1;
                }
                State::Target => {
                    let b = input[i];
                    match b {
                        b' ' => {
                            out.push(b);
                            self.state = State::Version;
                        }
                        b'\r' | b'\n' => {
                            out.push(b);
                            self.state = State::Version;
                        }
                        b'"'
                        | b'<'
                        | b'>'
                        | b'\\'
                        | b'^'
                        | b'`'
                        | b'{'
                        | b'|'
                        | b'}'
                        | 0x80..=0xFF => {
                            out.extend_from_slice(format!("%{b:02X}").as_bytes());
                        }
                        _ => out.push(b),
                    }
                    i += 1;
                }
                State::Version => {
                    let b = input[i];
                    out.push(b);
                    i += 1;
                    if b == b'\n' {
                        self.state = State::Headers;
                        self.line.clear();
                        self.content_length = 0;
                        self.passthrough_after_headers = false;
                    }
                }
                State::Headers => {
                    let b = input[i];
                    out.push(b);
                    i += 1;
                    if b != b'\n' {
                        if self.line.len() < MAX_HEADER_LINE {
                            self.line.push(b);
                        }
                        continue;
                    }
                    let line = std::mem::take(&mut self.line);
                    let line = line.strip_suffix(b"\r").unwrap_or(&line);
                    if line.is_empty() {
                        self.state = if self.passthrough_after_headers {
                            State::Passthrough
                        } else if self.content_length > 0 {
                            State::Body(self.content_length)
                        } else {
                            State::Method
                        };
                    } else {
                        self.header(line);
                    }
                }
            }
        }
    }

    fn header(&mut self, line: &[u8]) {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            return;
        };
        let name = String::from_utf8_lossy(&line[..colon])
            .trim()
            .to_ascii_lowercase();
        let value = String::from_utf8_lossy(&line[colon + 1..])
            .trim()
            .to_ascii_lowercase();
        match name.as_str() {
            "content-length" => self.content_length = value.parse().unwrap_or(0),
            "transfer-encoding" | "upgrade" => self.passthrough_after_headers = true,
            _ => {}
        }
    }
}

/// A connection whose request targets are rewritten as described above.
pub struct UriEscaping<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to the reader.
    pending: Vec<u8>,
    /// How much of `pending` was handed out.
    offset: usize,
}

impl<S> UriEscaping<S> {
    /// Wraps a freshly accepted connection.
    pub fn new(inner: S) -> Self {
        UriEscaping {
            inner,
            rewriter: Rewriter::new(),
            pending: Vec::new(),
            offset: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for UriEscaping<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.offset == this.pending.len() {
            this.pending.clear();
            this.offset = 0;
            let mut raw = [0u8; 8192];
            let mut raw_buf = ReadBuf::new(&mut raw);
            match Pin::new(&mut this.inner).poll_read(cx, &mut raw_buf) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            if raw_buf.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.rewriter.feed(raw_buf.filled(), &mut this.pending);
        }
        let n = (this.pending.len() - this.offset).min(buf.remaining());
        buf.put_slice(&this.pending[this.offset..this.offset + n]);
        this.offset += n;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for UriEscaping<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite_bytes(chunks: &[&[u8]]) -> Vec<u8> {
        let mut r = Rewriter::new();
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, &mut out);
        }
        out
    }

    fn rewrite(chunks: &[&[u8]]) -> String {
        String::from_utf8(rewrite_bytes(chunks)).unwrap()
    }

    #[test]
    fn only_request_targets_are_escaped() {
        let req = b"GET /v2/entities?q=t>40;n==\"a b\" HTTP/1.1\r\nHost: x\r\nX-A: <b>\r\n\r\n";
        // The space inside quotes ends the target, as it would for any parser:
        // clients must encode spaces; only the listed bytes are repaired.
        assert_eq!(
            rewrite(&[req]),
            "GET /v2/entities?q=t%3E40;n==%22a b\" HTTP/1.1\r\nHost: x\r\nX-A: <b>\r\n\r\n"
        );
    }

    #[test]
    fn bodies_are_skipped_and_the_next_request_is_rewritten_across_chunks() {
        let chunks: [&[u8]; 4] = [
            b"POST /v2/entities HTTP/1.1\r\nContent-Length: 9\r\n\r\n{\"a\":\"<\"",
            b"}",
            b"GET /v2/entities?q=a<",
            b"3 HTTP/1.1\r\n\r\n",
        ];
        assert_eq!(
            rewrite(&chunks),
            "POST /v2/entities HTTP/1.1\r\nContent-Length: 9\r\n\r\n{\"a\":\"<\"}GET /v2/entities?q=a%3C3 HTTP/1.1\r\n\r\n"
        );
    }

    #[test]
    fn upgrades_and_chunked_bodies_pass_through() {
        let ws = b"GET /api/v1/live HTTP/1.1\r\nUpgrade: websocket\r\n\r\n\x81\x05<<>>\"";
        assert_eq!(rewrite_bytes(&[ws]), &ws[..]);
        let chunked = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n<<<\r\n0\r\n\r\nGET /a<b HTTP/1.1\r\n\r\n";
        assert_eq!(rewrite_bytes(&[chunked]), &chunked[..]);
    }
}
