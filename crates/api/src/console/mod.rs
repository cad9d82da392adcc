//! The console: weft's web UI, served by weft itself at `/` with its
//! files under `/console/…`. It is a client of the JSON APIs like any
//! other (docs/console.md): this module only hands out its static files,
//! which are compiled into the binary, so nothing is fetched from
//! anywhere at run time and no build step or Node toolchain is needed.
//!
//! Every answer carries a strong `ETag` (the SHA-256 of the file) and
//! `Cache-Control: no-cache`, so browsers revalidate and get 304 until a
//! new weft ships new files; and a Content-Security-Policy that lets the
//! page load and connect to this origin only. The files hold no data:
//! they are served without an API key (the console asks for one and
//! sends it with every API call).

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::routes::{get, Access, Routes};

/// The prefix of the console's files.
pub const PREFIX: &str = "/console/";

/// What the console's pages may load and reach: this origin only (no
/// inline or remote scripts); inline styles, which the chart library
/// sets on its elements; `data:` images (the empty favicon). Page
/// previews are sandboxed `srcdoc` frames.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
     frame-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// One file of the console.
struct Asset {
    /// Its path under [`PREFIX`] (`index.html` is also `/`).
    path: &'static str,
    /// Its `Content-Type`.
    content_type: &'static str,
    /// Its bytes, compiled in.
    body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!("assets/", $path)),
        }
    };
}

/// The type of the console's scripts (ES modules need a JavaScript type).
const JS: &str = "text/javascript; charset=utf-8";
/// The type of its style sheets.
const CSS: &str = "text/css; charset=utf-8";

/// Every file of the console. A file not listed here is a 404.
static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", CSS),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("ui.js", JS),
    asset!("highlight.js", JS),
    asset!("views/overview.js", JS),
    asset!("views/devices.js", JS),
    asset!("views/device.js", JS),
    asset!("views/types.js", JS),
    asset!("views/rules.js", JS),
    asset!("views/alarms.js", JS),
    asset!("views/entities.js", JS),
    asset!("views/subscriptions.js", JS),
    asset!("views/channels.js", JS),
    asset!("views/pages.js", JS),
    asset!("vendor/uplot/uPlot.iife.min.js", JS),
    asset!("vendor/uplot/uPlot.min.css", CSS),
    asset!("vendor/uplot/LICENSE", "text/plain; charset=utf-8"),
];

/// The ETag of every asset, in [`ASSETS`]' order, computed on first use.
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.body);
            let tag = format!("\"{}\"", hex16(&digest));
            HeaderValue::from_str(&tag).expect("hex is a header value")
        })
        .collect()
});

/// The first 16 bytes of a digest as hex: enough to tell files apart.
fn hex16(digest: &[u8]) -> String {
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The console's routes: `/` (the page) and `/console/{*file}`, open:
/// static files holding no data (the console sends a key with every API
/// call it makes).
pub fn routes() -> Routes {
    Routes::new()
        .route("/", get(Access::Open, index))
        .route("/console", get(Access::Open, index))
        .route("/console/", get(Access::Open, index))
        .route("/console/{*file}", get(Access::Open, file))
}

/// `GET /`: the console's page.
async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// `GET /console/{*file}`: one of its files.
async fn file(Path(file): Path<String>, headers: HeaderMap) -> Response {
    serve(&file, &headers)
}

/// Answers `path` with its file (or 304 when the client holds it), or 404.
fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.path == path) else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such console file",
        )
            .into_response();
    };
    let asset = &ASSETS[i];
    let etag = &ETAGS[i];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|t| t.as_bytes() == etag.as_bytes() || t == "*")
        });
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let h = resp.headers_mut();
    h.insert(header::ETAG, etag.clone());
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed file is there, and its type follows its extension,
    /// so a browser never refuses a module for its MIME type.
    #[test]
    fn assets_have_types_that_match_their_names() {
        for a in ASSETS {
            assert!(!a.body.is_empty(), "{} is empty", a.path);
            let ext = a.path.rsplit('.').next().unwrap();
            let expected = match ext {
                "js" => JS,
                "css" => CSS,
                "html" => "text/html; charset=utf-8",
                _ => "text/plain; charset=utf-8",
            };
            assert_eq!(a.content_type, expected, "{}", a.path);
        }
    }

    /// A client holding the current file gets 304; another gets the file
    /// with its tag, the policy and no-cache.
    #[test]
    fn revalidation_answers_not_modified() {
        let resp = serve("app.js", &HeaderMap::new());
        assert_eq!(resp.status(), StatusCode::OK);
        let tag = resp.headers()[header::ETAG].clone();
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-cache");
        assert!(resp.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("script-src 'self'"));
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, tag);
        assert_eq!(serve("app.js", &headers).status(), StatusCode::NOT_MODIFIED);
        assert_eq!(
            serve("../Cargo.toml", &headers).status(),
            StatusCode::NOT_FOUND
        );
    }
}
