//! Who may call each route, declared where the route is declared.
//!
//! Every surface builds its routes with [`Routes`] and the method
//! constructors of this module ([`get`], [`post`], …), each of which takes
//! the route's [`Access`] beside its handler: there is no way to add a
//! route without saying who may call it. When the routes are given their
//! state ([`Routes::build`]) every handler is wrapped in a guard that
//! checks the request's credential against that declaration before the
//! handler (or any extractor) sees it ([`crate::auth::admit`]). Fallbacks
//! are declared the same way, so a path no route matches is refused like
//! any other request without a working key.
//!
//! The declarations are also a table ([`Routes::table`]): the route-table
//! test walks it for every listener and checks each route against the
//! role table of docs/security.md, so the documentation, the code and
//! the behaviour cannot drift apart.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::handler::Handler;
use axum::response::Response;
use axum::routing::{MethodFilter, MethodRouter, Route};
use axum::Router;
use futures::future::Either;
use serde::Serialize;
use tower::{Layer, Service};
use weft_model::apikey::Role;

use crate::AppState;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Access {
    /// Anyone, without a key: the route holds no data (`/health`, the
    /// probes, the console's static files).
    Open,
    /// An ingest credential: the global ingest key, an ingest key (whose
    /// pins the guard hands to the handler as
    /// [`crate::auth::IngestPins`]) or a global admin key.
    Ingest,
    /// An API key whose role is at least `role`, within `scope`.
    Key {
        /// The least role that may call the route.
        role: Role,
        /// Which tenants' keys may call it, and how the request is held
        /// to the key's tenant and service path.
        scope: Scope,
    },
}

/// How a keyed route is held to the key's tenant and service path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// weft's own API, the channels, pages and metrics: the default
    /// tenant's, so only keys without a tenant or service-path limit.
    Own,
    /// NGSI (Orion's paths): multi-tenant by `Fiware-Service`; a read
    /// without `Fiware-ServicePath` is given the key's path and below.
    Ngsi,
    /// QuantumLeap's API: multi-tenant by `Fiware-Service`, the key's
    /// service path as a prefix.
    QuantumLeap,
    /// NGSI-LD (`/ngsi-ld/v1`): multi-tenant by `NGSILD-Tenant`; it has
    /// no service paths, so a key limited to one may not call it.
    NgsiLd,
    /// `/api/v1/keys`: any tenant's key; the handler shows and manages
    /// only what the key may ([`crate::keys`]).
    Keys,
    /// The live websocket and SSE: any tenant's key, which may also come
    /// as `?access_token=` (browsers cannot set headers on either); the
    /// handler holds each subscription to the key's scope.
    Live,
}

impl Access {
    /// A read key or better, within `scope`.
    pub const fn read(scope: Scope) -> Access {
        Access::Key {
            role: Role::Read,
            scope,
        }
    }

    /// A write key or better, within `scope`.
    pub const fn write(scope: Scope) -> Access {
        Access::Key {
            role: Role::Write,
            scope,
        }
    }

    /// An admin key, within `scope`.
    pub const fn admin(scope: Scope) -> Access {
        Access::Key {
            role: Role::Admin,
            scope,
        }
    }
}

impl std::fmt::Display for Access {
    /// As docs/security.md's route table writes it: `open`, `ingest`, or
    /// the role and the scope (`read own`, `write ngsi`, `admin keys`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Open => f.write_str("open"),
            Access::Ingest => f.write_str("ingest"),
            Access::Key { role, scope } => {
                let scope = match scope {
                    Scope::Own => "own",
                    Scope::Ngsi => "ngsi",
                    Scope::QuantumLeap => "quantumleap",
                    Scope::NgsiLd => "ngsi-ld",
                    Scope::Keys => "keys",
                    Scope::Live => "live",
                };
                write!(f, "{} {scope}", role.as_str())
            }
        }
    }
}

/// One method of one route and who may call it: a row of the route
/// table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Declared {
    /// The HTTP method (`GET` also answers `HEAD`).
    pub method: &'static str,
    /// The route's path as axum matches it (`/v2/entities/{id}`); `/*`
    /// (under its prefix) for the fallback, which answers every path no
    /// route matches, whatever the method (`*`).
    pub path: String,
    /// Who may call it.
    pub access: Access,
}

/// The methods of one route, each with its handler and its [`Access`];
/// made by [`get`], [`post`], [`put`], [`patch`], [`delete`] and chained
/// with the methods of the same names.
#[must_use]
pub struct Methods {
    /// Each method on its own, so each gets its own guard at build time.
    methods: Vec<(&'static str, Access, MethodRouter<AppState>)>,
    /// What a method the route does not have gets, instead of axum's 405
    /// (NGSI answers Orion's); it sees no data, so it needs no key.
    other_methods: Option<MethodRouter<AppState>>,
}

macro_rules! method {
    ($(#[$doc:meta])* $name:ident, $filter:ident, $text:literal) => {
        $(#[$doc])*
        pub fn $name<H, T>(access: Access, handler: H) -> Methods
        where
            H: Handler<T, AppState>,
            T: 'static,
        {
            Methods { methods: Vec::new(), other_methods: None }.$name(access, handler)
        }

        impl Methods {
            $(#[$doc])*
            pub fn $name<H, T>(mut self, access: Access, handler: H) -> Methods
            where
                H: Handler<T, AppState>,
                T: 'static,
            {
                self.methods.push((
                    $text,
                    access,
                    axum::routing::on(MethodFilter::$filter, handler),
                ));
                self
            }
        }
    };
}

method!(
    /// `GET` (and `HEAD`) of a route, callable as `access` says.
    get, GET, "GET"
);
method!(
    /// `POST` of a route, callable as `access` says.
    post, POST, "POST"
);
method!(
    /// `PUT` of a route, callable as `access` says.
    put, PUT, "PUT"
);
method!(
    /// `PATCH` of a route, callable as `access` says.
    patch, PATCH, "PATCH"
);
method!(
    /// `DELETE` of a route, callable as `access` says.
    delete, DELETE, "DELETE"
);

impl Methods {
    /// Answers the methods this route does not have with `handler`
    /// (Orion's 405 on the NGSI surface) instead of axum's.
    pub fn other_methods<H, T>(mut self, handler: H) -> Methods
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        self.other_methods = Some(MethodRouter::new().fallback(handler));
        self
    }

    /// The route's methods, each behind its guard, as one method router.
    fn build(self, state: &AppState) -> MethodRouter<AppState> {
        let mut router = MethodRouter::new();
        for (_, access, method) in self.methods {
            router = router.merge(method.route_layer(GuardLayer {
                access,
                state: state.clone(),
            }));
        }
        match self.other_methods {
            Some(other) => router.merge(other),
            None => router,
        }
    }
}

/// A part applied to a built router once its state is known (a layer
/// that needs the state).
type Finish = Box<dyn FnOnce(Router<AppState>, &AppState) -> Router<AppState> + Send>;

/// A surface's routes with who may call each: the only way routes are
/// added to weft's routers, so none goes undeclared. Built into an axum
/// router by [`Routes::build`].
#[must_use]
#[derive(Default)]
pub struct Routes {
    /// Each route's path and methods.
    routes: Vec<(String, Methods)>,
    /// Routes of other surfaces merged into these, built on their own
    /// (their finishing layers apply to them only).
    merged: Vec<Routes>,
    /// Routes nested under a prefix.
    nested: Vec<(String, Routes)>,
    /// What answers a path no route matches, and who may call it.
    fallback: Option<(Access, MethodRouter<AppState>)>,
    /// Layers that need the state, applied to these routes once built.
    finish: Vec<Finish>,
}

impl Routes {
    /// No routes yet.
    pub fn new() -> Routes {
        Routes::default()
    }

    /// Adds `path` with its declared `methods`.
    pub fn route(mut self, path: &str, methods: Methods) -> Routes {
        self.routes.push((path.to_string(), methods));
        self
    }

    /// Adds every route of `other` (built on its own, so its finishing
    /// layers stay its own).
    pub fn merge(mut self, other: Routes) -> Routes {
        self.merged.push(other);
        self
    }

    /// Adds every route of `other` under `prefix`.
    pub fn nest(mut self, prefix: &str, other: Routes) -> Routes {
        self.nested.push((prefix.to_string(), other));
        self
    }

    /// Answers every path no route matches with `handler`, callable as
    /// `access` says.
    pub fn fallback<H, T>(mut self, access: Access, handler: H) -> Routes
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        self.fallback = Some((access, axum::routing::any(handler)));
        self
    }

    /// Applies `finish` to these routes once built, with the state (for
    /// layers that need it, as `route_layer(from_fn_with_state(…))`).
    pub fn finish(
        mut self,
        finish: impl FnOnce(Router<AppState>, &AppState) -> Router<AppState> + Send + 'static,
    ) -> Routes {
        self.finish.push(Box::new(finish));
        self
    }

    /// Every route's methods and who may call each, paths as matched
    /// (nested routes with their prefix).
    pub fn table(&self) -> Vec<Declared> {
        let mut table = Vec::new();
        self.collect("", &mut table);
        table
    }

    fn collect(&self, prefix: &str, table: &mut Vec<Declared>) {
        for (path, methods) in &self.routes {
            for (method, access, _) in &methods.methods {
                table.push(Declared {
                    method,
                    path: format!("{prefix}{path}"),
                    access: *access,
                });
            }
        }
        for other in &self.merged {
            other.collect(prefix, table);
        }
        for (nest, other) in &self.nested {
            other.collect(&format!("{prefix}{nest}"), table);
        }
        if let Some((access, _)) = &self.fallback {
            table.push(Declared {
                method: "*",
                path: format!("{prefix}/*"),
                access: *access,
            });
        }
    }

    /// The axum router of these routes, each behind the guard of its
    /// declaration, checking credentials against `state`'s keys.
    pub fn build(self, state: &AppState) -> Router<AppState> {
        let mut router = Router::new();
        for (path, methods) in self.routes {
            router = router.route(&path, methods.build(state));
        }
        for other in self.merged {
            router = router.merge(other.build(state));
        }
        for (prefix, other) in self.nested {
            router = router.nest(&prefix, other.build(state));
        }
        for finish in self.finish {
            router = finish(router, state);
        }
        if let Some((access, handler)) = self.fallback {
            // `any` is all fallback, which `route_layer` leaves out.
            let guarded = handler
                .layer(GuardLayer {
                    access,
                    state: state.clone(),
                })
                .with_state(state.clone());
            router = router.fallback_service(guarded);
        }
        router
    }
}

/// Wraps a route's handler in its [`Guard`].
#[derive(Clone)]
struct GuardLayer {
    access: Access,
    state: AppState,
}

impl Layer<Route> for GuardLayer {
    type Service = Guard;

    fn layer(&self, inner: Route) -> Guard {
        Guard {
            inner,
            access: self.access,
            state: self.state.clone(),
        }
    }
}

/// A route's handler behind the check of its declared [`Access`]: a
/// refused request gets its 401/403/429 and never reaches the handler.
#[derive(Clone)]
struct Guard {
    inner: Route,
    access: Access,
    state: AppState,
}

impl Service<Request> for Guard {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, <Route as Service<Request>>::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        <Route as Service<Request>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        match crate::auth::admit(&self.state, self.access, &mut req) {
            Ok(()) => Either::Right(self.inner.call(req)),
            Err(refused) => Either::Left(ready(Ok(refused))),
        }
    }
}
