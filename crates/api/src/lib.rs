//! weft's HTTP surfaces. Each module is one surface with its own
//! `router()`; [`app`] merges them and applies the shared layers once.
//! Handlers call the services the binary wired ([`AppState`]) or the Store
//! trait, never SQL.
//!
//! - [`ingest`]: sensae's `/sensor-data/…` path and the TTN / ChirpStack webhooks.
//! - [`alarms`]: `/api/v1/rules` and `/api/v1/alarms`.
//! - [`channels`]: DSPS's durable pull channels at `/channel/…` and `/probe/…`,
//!   their bridges (`/api/v1/bridges`) and listing (`/api/v1/channels`).
//! - [`catalog`]: `/api/v1/device-types` and `/api/v1/devices`.
//! - [`downlinks`]: `/api/v1/devices/{id}/downlinks` and the IoT Agent
//!   JSON command answers at `/iot/json/commands`.
//! - [`data`]: `/api/v1/data` and `/api/v1/uplinks/failed`.
//! - [`live`]: `/api/v1/live` websocket and SSE.
//! - [`pages`]: page templates, their services and `/pages/{name}`.
//! - [`console`]: the web console at `/` and its files under `/console/`.
//! - [`ops`]: `/health`, `/metrics`, `/api/v1/openapi.json`.
//! - [`ngsi`]: Orion's NGSIv2 API at `/v2` and `/version`.
//! - [`ngsi_ld`]: NGSI-LD at `/ngsi-ld/v1`, over the same entities.
//! - [`history`]: QuantumLeap's API (1.0.0): `POST /v2/notify`, and the whole API under `/ql`.
//! - [`routes`]: every route declares who may call it, and a guard checks
//!   it before the handler ([`auth`] holds the checks); [`keys`]:
//!   `/api/v1/keys`, where keys are made and revoked.
#![deny(missing_docs)]

pub mod alarms;
pub mod auth;
pub mod catalog;
pub mod channels;
pub mod console;
pub mod data;
pub mod downlinks;
pub mod error;
pub mod history;
pub mod ingest;
pub mod keys;
pub mod live;
pub mod ngsi;
pub mod ngsi_ld;
pub mod ops;
pub mod pages;
pub mod routes;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, HttpBody};
use axum::extract::{DefaultBodyLimit, Request};
use axum::http;
use axum::response::Response;
use axum::routing::future::RouteFuture;
use axum::Router;
use futures::future::Either;
use tower::Service;
use weft_pages::Pages;
use weft_pipeline::keys::Keys;
use weft_pipeline::Services;

use routes::Routes;

pub use error::{ApiError, ApiResult};

/// Renders the Prometheus exposition text; given by the binary, which owns
/// the metrics recorder.
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

/// What handlers share: cheap to clone (handles only).
#[derive(Clone)]
pub struct AppState {
    /// weft's services (ingest, catalog, context, rules, channels, …, the
    /// store and the bus), wired once by the binary. One `Arc` for all, so
    /// cloning the state for a request costs one count.
    pub services: Arc<Services>,
    /// Pages and their services, built by the binary on top of the
    /// context and the rules.
    pub pages: Arc<Pages>,
    /// The key sensae-path and webhook uplinks must carry in
    /// `Authorization`; `None` accepts any.
    pub ingest_key: Option<Arc<str>>,
    /// Renders `/metrics`.
    pub metrics: MetricsRender,
    /// Where live websocket connections run. A runtime of their own keeps
    /// event delivery from queueing behind every ready HTTP request on the
    /// main runtime (measured: ~10 ms at 5,000 uplinks/s).
    pub live_runtime: tokio::runtime::Handle,
    /// Whether `Fiware-Service` selects a tenant (weft's default). Off, it
    /// behaves like Orion started without `-multiservice`: one tenant for
    /// all, the header only passed on to notifications.
    pub ngsi_multiservice: bool,
    /// How requests are authenticated ([`auth`]).
    pub auth: auth::AuthMode,
    /// The API keys, held in memory.
    pub keys: Arc<Keys>,
    /// Whether QuantumLeap's API answers as its unreleased master does
    /// (`id`/`type` keys, 200 `[]` for no data) instead of release 1.0.0
    /// (`history.quantumleap_master`).
    pub quantumleap_master: bool,
}

/// Largest request body weft accepts on its own surfaces (1 MiB, the same
/// limit Orion applies), so one client cannot make it buffer without bound.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Every route of weft's main listener but NGSI's, with who may call it.
fn other_routes() -> Routes {
    Routes::new()
        .merge(ingest::routes())
        .merge(catalog::routes())
        .merge(downlinks::routes())
        .merge(alarms::routes())
        .merge(channels::routes())
        .merge(channels::bridges_routes())
        .merge(channels::listing_routes())
        .merge(pages::routes())
        .merge(data::routes())
        .merge(live::routes())
        .merge(ops::routes())
        .merge(history::routes())
        .merge(ngsi_ld::routes())
        .merge(keys::routes())
        .merge(console::routes())
}

/// Every route of weft's main listener with who may call it, NGSI's and
/// its fallback (which answers every unknown path) among them: the table
/// the route-table test checks against docs/security.md. QuantumLeap's
/// own listener has [`history::quantumleap_routes`].
pub fn main_routes() -> Routes {
    other_routes().merge(ngsi::routes())
}

/// Every listener's routes and who may call each, as rows `(listener,
/// route)`: `main` (weft's listener) and `quantumleap`
/// (`history.quantumleap_listen`), sorted by listener, path and method.
/// `weft routes` prints it; the
/// route-table test checks it against docs/security.md and walks it.
pub fn route_table() -> Vec<(&'static str, routes::Declared)> {
    let main = main_routes().table().into_iter().map(|r| ("main", r));
    let ql = history::quantumleap_routes()
        .table()
        .into_iter()
        .map(|r| ("quantumleap", r));
    let mut table: Vec<_> = main.chain(ql).collect();
    table.sort_by(|(l1, a), (l2, b)| (l1, &a.path, a.method).cmp(&(l2, &b.path, b.method)));
    table
}

/// All of weft's surfaces as one service: NGSI's own paths go straight to
/// [`ngsi::Surface`], the rest to the router of the other surfaces, whose
/// fallback is the NGSI surface as well (it answers unknown paths, as
/// Orion does). Every route checks the credential its declaration asks
/// for ([`routes`]) before its handler runs.
pub fn app(state: AppState) -> App {
    let ngsi = ngsi::service(state.clone());
    let others = other_routes()
        .build(&state)
        .fallback_service(ngsi.clone())
        .with_state(state);
    App { ngsi, others }
}

/// weft's HTTP service (see [`app`]). Sending NGSI's paths past the other
/// surfaces' router saves each NGSI request a failed lookup there and a
/// hop through its fallback.
#[derive(Clone)]
pub struct App {
    ngsi: ngsi::Surface,
    others: Router,
}

impl<B> Service<http::Request<B>> for App
where
    B: HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<<ngsi::Surface as Service<Request>>::Future, RouteFuture<Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if ngsi::owns(req.uri().path()) {
            return Either::Left(self.ngsi.call(req.map(Body::new)));
        }
        // Here rather than as a layer of the router, which would wrap
        // (and clone, and box the future of) every route on every request.
        limit_body(&mut req);
        ngsi_ld::trim_trailing_slash(&mut req);
        Either::Right(self.others.call(req))
    }
}

/// Holds the body of `req` to [`MAX_BODY_BYTES`] (413 beyond), where it
/// could outgrow it: a body whose length is announced within the limit
/// cannot (hyper reads no more than `Content-Length`), and a request with
/// neither a length nor a transfer coding has none. Those, nearly all,
/// are spared the extension axum's limit is (an allocation per request).
pub(crate) fn limit_body<B>(req: &mut http::Request<B>) {
    let headers = req.headers();
    let announced_within = |v: &http::HeaderValue| {
        v.to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n <= MAX_BODY_BYTES as u64)
    };
    let bounded = !headers.contains_key(http::header::TRANSFER_ENCODING)
        && headers
            .get(http::header::CONTENT_LENGTH)
            .is_none_or(announced_within);
    if !bounded {
        DefaultBodyLimit::max(MAX_BODY_BYTES).apply(req);
    }
}

#[cfg(test)]
mod tests {
    use axum::extract::FromRequest;
    use axum::response::IntoResponse;

    use super::*;

    /// Reads the body of a request with `headers` and `len` bytes through
    /// [`limit_body`], as a handler taking `Bytes` would.
    async fn read(headers: &[(&str, &str)], len: usize) -> Result<usize, http::StatusCode> {
        let mut req = http::Request::new(Body::from(vec![b'x'; len]));
        for (name, value) in headers {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        limit_body(&mut req);
        bytes::Bytes::from_request(req, &())
            .await
            .map(|b| b.len())
            .map_err(|e| e.into_response().status())
    }

    /// Bodies over the limit get 413 whether their length is announced or
    /// they come chunked (axum's own default, 2 MiB, would let 1.9 MB
    /// through); bodies announced within the limit are read whole.
    #[tokio::test]
    async fn bodies_are_held_to_the_limit() {
        let over = 1_900_000;
        let too_large = Err(http::StatusCode::PAYLOAD_TOO_LARGE);
        let length = over.to_string();
        assert_eq!(read(&[("content-length", &length)], over).await, too_large);
        assert_eq!(
            read(&[("transfer-encoding", "chunked")], over).await,
            too_large
        );
        let within = MAX_BODY_BYTES.to_string();
        assert_eq!(
            read(&[("content-length", &within)], MAX_BODY_BYTES).await,
            Ok(MAX_BODY_BYTES)
        );
        assert_eq!(read(&[], 0).await, Ok(0));
    }
}
