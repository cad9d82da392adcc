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
//!
//! It sits on every request weft serves, so the common case costs next to
//! nothing: bytes are read straight into hyper's buffer and only scanned
//! (a `memchr` per line, a table lookup per request-target byte, a skip
//! over each body); they are copied only when a request target actually
//! holds a byte to escape.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

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

/// What a byte means inside a request target.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TargetByte {
    /// Kept as it is.
    Keep,
    /// Ends the target (space, CR, LF).
    End,
    /// Forbidden by HTTP but sent raw by Orion's clients: percent-encoded.
    Escape,
}

/// [`TargetByte`] of every byte value, so the scan of a target is one
/// lookup per byte.
static TARGET_BYTES: [TargetByte; 256] = {
    let mut table = [TargetByte::Keep; 256];
    table[b' ' as usize] = TargetByte::End;
    table[b'\r' as usize] = TargetByte::End;
    table[b'\n' as usize] = TargetByte::End;
    let escaped = b"\"<>\\^`{|}";
    let mut i = 0;
    while i < escaped.len() {
        table[escaped[i] as usize] = TargetByte::Escape;
        i += 1;
    }
    let mut b = 0x80;
    while b <= 0xFF {
        table[b] = TargetByte::Escape;
        b += 1;
    }
    table
};

/// Request-target rewriting over a byte stream, kept apart from I/O so it
/// can be tested on its own.
#[derive(Debug)]
struct Rewriter {
    state: State,
    /// The start of a header line whose end has not been read yet (at
    /// most [`MAX_HEADER_LINE`] bytes); empty while lines arrive whole.
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

    /// Follows the requests through `input` without copying it. Stops at
    /// the first request-target byte that must be escaped and returns its
    /// index (everything before it is consumed, the byte itself is not);
    /// `None` when all of `input` passes unchanged.
    fn scan(&mut self, input: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < input.len() {
            let rest = &input[i..];
            match self.state {
                State::Passthrough => return None,
                State::Body(left) => {
                    let take = left.min(rest.len() as u64);
                    i += take as usize;
                    self.state = if take == left {
                        State::Method
                    } else {
                        State::Body(left - take)
                    };
                }
                State::Method => match memchr::memchr(b' ', rest) {
                    Some(at) => {
                        i += at + 1;
                        self.state = State::Target;
                    }
                    None => return None,
                },
                State::Target => {
                    let mut end = None;
                    for (at, b) in rest.iter().enumerate() {
                        match TARGET_BYTES[usize::from(*b)] {
                            TargetByte::Keep => {}
                            TargetByte::End => {
                                end = Some(at);
                                break;
                            }
                            TargetByte::Escape => return Some(i + at),
                        }
                    }
                    match end {
                        Some(at) => {
                            i += at + 1;
                            self.state = State::Version;
                        }
                        // The target goes on in the next read.
                        None => return None,
                    }
                }
                State::Version => match memchr::memchr(b'\n', rest) {
                    Some(at) => {
                        i += at + 1;
                        self.state = State::Headers;
                        self.line.clear();
                        self.content_length = 0;
                        self.passthrough_after_headers = false;
                    }
                    None => return None,
                },
                State::Headers => match memchr::memchr(b'\n', rest) {
                    Some(at) => {
                        i += at + 1;
                        if self.line.is_empty() {
                            self.end_of_line(&rest[..at]);
                        } else {
                            // The line began in an earlier read.
                            let mut line = std::mem::take(&mut self.line);
                            keep_line_start(&mut line, &rest[..at]);
                            self.end_of_line(&line);
                            line.clear();
                            self.line = line;
                        }
                    }
                    None => {
                        let mut line = std::mem::take(&mut self.line);
                        keep_line_start(&mut line, rest);
                        self.line = line;
                        return None;
                    }
                },
            }
        }
        None
    }

    /// Appends `input`, rewritten, to `out`.
    fn rewrite(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while let Some(at) = self.scan(input) {
            let b = input[at];
            out.extend_from_slice(&input[..at]);
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
            input = &input[at + 1..];
        }
        out.extend_from_slice(input);
    }

    /// A whole header line (without its `\n`) was read: an empty one ends
    /// the headers.
    fn end_of_line(&mut self, line: &[u8]) {
        let line = &line[..line.len().min(MAX_HEADER_LINE)];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !line.is_empty() {
            self.header(line);
            return;
        }
        self.state = if self.passthrough_after_headers {
            State::Passthrough
        } else if self.content_length > 0 {
            State::Body(self.content_length)
        } else {
            State::Method
        };
    }

    fn header(&mut self, line: &[u8]) {
        let Some(colon) = memchr::memchr(b':', line) else {
            return;
        };
        let name = line[..colon].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            self.content_length = std::str::from_utf8(line[colon + 1..].trim_ascii())
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            self.passthrough_after_headers = true;
        }
    }
}

/// Upper-case hexadecimal digits, for `%XX`.
const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `more` to the partial header line `line`, keeping at most
/// [`MAX_HEADER_LINE`] bytes (a longer line is not inspected past them).
fn keep_line_start(line: &mut Vec<u8>, more: &[u8]) {
    let room = MAX_HEADER_LINE.saturating_sub(line.len());
    line.extend_from_slice(&more[..more.len().min(room)]);
}

/// A connection whose request targets are rewritten as described above.
pub struct UriEscaping<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to the reader (only after a target
    /// needed escaping: the rewritten bytes outgrow the reader's buffer).
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
        if this.offset < this.pending.len() {
            let n = (this.pending.len() - this.offset).min(buf.remaining());
            buf.put_slice(&this.pending[this.offset..this.offset + n]);
            this.offset += n;
            return Poll::Ready(Ok(()));
        }
        // Read straight into the reader's buffer and look at what came.
        let start = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let Some(at) = this.rewriter.scan(&buf.filled()[start..]) else {
            return Poll::Ready(Ok(()));
        };
        // A byte to escape: what follows it is taken back out of `buf`,
        // rewritten into `pending`, and handed out from there.
        let cut = start + at;
        this.pending.clear();
        this.rewriter
            .rewrite(&buf.filled()[cut..], &mut this.pending);
        buf.set_filled(cut);
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending[..n]);
        this.offset = n;
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
    use tokio::io::AsyncReadExt;

    fn rewrite_bytes(chunks: &[&[u8]]) -> Vec<u8> {
        let mut r = Rewriter::new();
        let mut out = Vec::new();
        for c in chunks {
            r.rewrite(c, &mut out);
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

    /// Every byte HTTP forbids in a target (and every non-ASCII one) is
    /// escaped, upper-case hex; the bytes Orion's queries use legitimately
    /// (`=`, `;`, `,`, `:`, `%`) are kept.
    #[test]
    fn the_escaped_set() {
        let req = b"GET /a?q=\"<>\\^`{|}\xC3\xA9=;,:%41 HTTP/1.1\r\n\r\n";
        assert_eq!(
            rewrite(&[req]),
            "GET /a?q=%22%3C%3E%5C%5E%60%7B%7C%7D%C3%A9=;,:%41 HTTP/1.1\r\n\r\n"
        );
    }

    /// A pipelined sequence, cut at every possible place into two reads,
    /// is rewritten as when it arrives whole: header lines split across
    /// reads (`Content-Len` | `gth: 5`) still give the body's length, so
    /// the `<` in the body stays and the one in the next target does not.
    #[test]
    fn any_split_gives_the_same_result() {
        let stream: &[u8] = b"PATCH /v2/entities/R1/attrs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{\"<\"}GET /v2/entities?q=t>4 HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\n\r\n";
        let whole = rewrite(&[stream]);
        assert_eq!(
            whole,
            "PATCH /v2/entities/R1/attrs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{\"<\"}GET /v2/entities?q=t%3E4 HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\n\r\n"
        );
        for cut in 0..=stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(rewrite(&[a, b]), whole, "cut at {cut}");
        }
    }

    /// Header names are matched without regard to case or surrounding
    /// blanks; a header line longer than [`MAX_HEADER_LINE`] is passed on
    /// uninspected, whole.
    #[test]
    fn header_names_and_long_lines() {
        let req = b"POST /a HTTP/1.1\r\ncOnTeNt-LeNgTh :  2 \r\n\r\n<>GET /b> HTTP/1.1\r\n\r\n";
        assert_eq!(
            rewrite(&[req]),
            "POST /a HTTP/1.1\r\ncOnTeNt-LeNgTh :  2 \r\n\r\n<>GET /b%3E HTTP/1.1\r\n\r\n"
        );
        let long = format!(
            "GET /a HTTP/1.1\r\nX-Long: {}\r\n\r\nGET /b> HTTP/1.1\r\n\r\n",
            "y".repeat(3 * MAX_HEADER_LINE)
        );
        let expected = long.replace("/b>", "/b%3E");
        assert_eq!(rewrite(&[long.as_bytes()]), expected);
        let (a, b) = long.as_bytes().split_at(MAX_HEADER_LINE);
        assert_eq!(rewrite(&[a, b]), expected);
    }

    /// Hands out its bytes in the given reads, at most as many as the
    /// reader's buffer holds.
    struct Reads(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Reads {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(mut chunk) = self.0.pop_front() {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                if n < chunk.len() {
                    self.0.push_front(chunk.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    /// Reads all of `reads` through [`UriEscaping`] with a buffer of
    /// `buf_len` bytes.
    async fn read_through(reads: &[&[u8]], buf_len: usize) -> Vec<u8> {
        let mut conn = UriEscaping::new(Reads(reads.iter().map(|r| r.to_vec()).collect()));
        let mut out = Vec::new();
        let mut buf = vec![0u8; buf_len];
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    /// The connection gives the reader the rewritten stream whatever its
    /// buffer size: bytes that need no escape go straight into the
    /// reader's buffer, a rewritten target that outgrows it is handed out
    /// over the next reads.
    #[tokio::test]
    async fn the_connection_reads_the_rewritten_stream() {
        let reads: [&[u8]; 3] = [
            b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v2/entities?q=name==\"x\";t>40 HTTP/1.1\r\nHost: x\r\n\r\nPOST /v2/op/update HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
            b"<<<GET /a{b} HTTP/1.1\r\n\r\n",
        ];
        let expected = rewrite(&reads);
        assert!(expected.contains("q=name==%22x%22;t%3E40 "));
        assert!(expected.contains("\r\n\r\n<<<GET /a%7Bb%7D "));
        for buf_len in [1, 2, 7, 64, 8192] {
            let got = read_through(&reads, buf_len).await;
            assert_eq!(
                String::from_utf8(got).unwrap(),
                expected,
                "buffer of {buf_len}"
            );
        }
    }
}
