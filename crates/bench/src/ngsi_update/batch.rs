//! Setup and verification requests: a list of one-off requests worked
//! through by a few keep-alive connections in parallel, outside the
//! measured load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;

use crate::http::{Conn, Response};

/// Longest wait for one setup or verification response.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends every request of `requests` (complete HTTP/1.1 requests) over
/// `parallel` connections and returns the responses in the same order, or
/// why there was none. The bar's position counts answered requests.
pub async fn exchange_all(
    connect: &str,
    requests: Vec<Vec<u8>>,
    parallel: usize,
    bar: &ProgressBar,
) -> Vec<Result<Response, String>> {
    let total = requests.len();
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..parallel.clamp(1, total.max(1)))
        .map(|_| {
            let requests = requests.clone();
            let next = next.clone();
            let connect = connect.to_string();
            let bar = bar.clone();
            tokio::spawn(async move {
                let mut conn: Option<Conn> = None;
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(i) else {
                        break;
                    };
                    let result = tokio::time::timeout(TIMEOUT, async {
                        if conn.is_none() {
                            conn = Some(Conn::connect(&connect).await?);
                        }
                        let c = conn.as_mut().expect("connected above");
                        let mut body = Vec::new();
                        let head = c.round_trip(request, Some(&mut body)).await?;
                        let location = c.location().map(str::to_string);
                        if !c.reusable() {
                            conn = None;
                        }
                        Ok::<_, std::io::Error>(Response {
                            status: head.status,
                            body,
                            location,
                        })
                    })
                    .await;
                    let result = match result {
                        Ok(Ok(r)) => Ok(r),
                        Ok(Err(e)) => {
                            conn = None;
                            Err(e.to_string())
                        }
                        Err(_) => {
                            conn = None;
                            Err(format!("no response within {}s", TIMEOUT.as_secs()))
                        }
                    };
                    bar.inc(1);
                    out.push((i, result));
                }
                out
            })
        })
        .collect();
    let mut results: Vec<Option<Result<Response, String>>> = (0..total).map(|_| None).collect();
    for handle in handles {
        match handle.await {
            Ok(out) => {
                for (i, r) in out {
                    results[i] = Some(r);
                }
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every request was taken by a connection"))
        .collect()
}
