//! The mock data services, in the bench process on loopback: each path
//! answers a fixed JSON body, as Knot.x's benchmark mocks did (on another
//! host there; here they share the 2 cores, which only costs weft).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A running mock: its base URL and how many requests it answered.
pub struct Mock {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Requests answered.
    pub calls: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Mock {
    /// Binds a loopback port; bodies are given later with [`Mock::serve`].
    pub async fn bind() -> anyhow::Result<(TcpListener, String)> {
        Mock::bind_at("127.0.0.1:0").await
    }

    /// [`Mock::bind`] at a given address, so a peer configured in advance
    /// finds the services where its configuration says they are.
    pub async fn bind_at(addr: &str) -> anyhow::Result<(TcpListener, String)> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("binding the mock services at {addr}: {e}"))?;
        let url = format!("http://{}", listener.local_addr()?);
        Ok((listener, url))
    }

    /// Serves `bodies` (path → JSON) on `listener`.
    pub fn serve(listener: TcpListener, url: String, bodies: HashMap<String, Bytes>) -> Mock {
        let bodies = Arc::new(bodies);
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let bodies = bodies.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        counter.fetch_add(1, Ordering::Relaxed);
                        let body = bodies.get(req.uri().path()).cloned();
                        async move {
                            let response = match body {
                                Some(body) => Response::builder()
                                    .header("content-type", "application/json")
                                    .body(http_body_util::Full::new(body)),
                                None => Response::builder()
                                    .status(StatusCode::NOT_FOUND)
                                    .body(http_body_util::Full::new(Bytes::new())),
                            };
                            Ok::<_, Infallible>(response.expect("valid response"))
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Mock { url, calls, task }
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.task.abort();
    }
}
