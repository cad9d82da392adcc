//! The HTTP/1.1 server loop. `axum::serve` would do, except for two things
//! Orion's clients and its functional tests see: header names are sent in
//! Title-Case (as Orion sends them; HTTP says case does not matter, but
//! tests and some clients compare them literally), and `TCP_NODELAY` is set
//! on every connection (small writes — live events, 202s — go out at once
//! instead of waiting for Nagle's algorithm and the peer's delayed ACK, up
//! to 40 ms on Linux). Request targets with bytes HTTP forbids but Orion's
//! clients send raw (`q=temperature>40`) are repaired first
//! ([`crate::uri_escape`]).
//!
//! With a [`TlsAcceptor`] every connection is a TLS one: its handshake
//! runs in the connection's own task (bounded by [`TLS_HANDSHAKE`]), so a
//! slow or broken client never holds up the accept loop.
//!
//! A client must send a request's whole head (request line and headers)
//! within the listener's header timeout (`[http] header_timeout`, 10 s by
//! default), or its connection is closed: one that trickles its headers
//! (slowloris) cannot hold a connection and its task for ever. On a
//! keep-alive connection the same timeout bounds the idle wait for the
//! next request (hyper starts it when it waits for a request head).
//!
//! Shutdown: once `shutdown` is cancelled no new connection is accepted;
//! open connections finish their in-flight request (for at most
//! [`DRAIN_CONNECTIONS`]) and are closed.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::uri_escape::UriEscaping;

/// Longest wait for open connections to finish at shutdown.
pub const DRAIN_CONNECTIONS: Duration = Duration::from_secs(10);

/// Longest a client may take to complete its TLS handshake.
pub const TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// Default of `[http] header_timeout`: how long a client has to send a
/// request's head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` (weft's API, or QuantumLeap's on its own port) on
/// `listener` until `shutdown` is cancelled; over TLS when `tls` is given.
/// A connection whose request head does not arrive within
/// `header_timeout` is closed.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    tls: Option<TlsAcceptor>,
    header_timeout: Duration,
    shutdown: CancellationToken,
) where
    S: tower::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let connections = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off, retry.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let app = app.clone();
        let shutdown = shutdown.clone();
        match tls.clone() {
            None => connections.spawn(serve_connection(stream, app, header_timeout, shutdown)),
            Some(tls) => connections.spawn(async move {
                match tokio::time::timeout(TLS_HANDSHAKE, tls.accept(stream)).await {
                    Ok(Ok(stream)) => serve_connection(stream, app, header_timeout, shutdown).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            }),
        };
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(DRAIN_CONNECTIONS, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still open after the drain timeout");
    }
}

/// Serves HTTP/1.1 on one accepted connection (plain or TLS) until the
/// client closes it, sends no complete request head within
/// `header_timeout`, or `shutdown` is cancelled.
async fn serve_connection<I, S>(
    io: I,
    app: S,
    header_timeout: Duration,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let connection = hyper::server::conn::http1::Builder::new()
        .title_case_headers(true)
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(UriEscaping::new(io)), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        _ = shutdown.cancelled() => {
            // Finish the request in flight, then close.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Pending connections the kernel may queue for each listener before
/// refusing more (capped by `net.core.somaxconn`). tokio's default of 1024
/// overflows when thousands of clients connect at once (the `channels`
/// benchmark's 8,000 pollers), and each refused SYN costs its client a 1 s,
/// then 3 s, retransmission.
pub const LISTEN_BACKLOG: u32 = 8192;

/// Binds a listener with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, so a
/// restarted weft can take its port back at once).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
