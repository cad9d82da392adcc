//! NGSI-LD (ETSI GS CIM 009) over weft's entities: the `@context`s that
//! give names their meaning ([`context`]), an NGSI-LD entity read into the
//! entity weft stores and shown back ([`entity`]), its query language
//! ([`query`]) and geo-queries ([`geo`]), and the errors the API
//! answers with ([`LdError`]).
//!
//! There is one entity store: an entity written through `/ngsi-ld/v1` is
//! the entity `/v2` reads, and the other way round. How the two
//! representations map onto each other is documented in docs/ngsi-ld.md
//! and in [`entity`].

pub mod context;
pub mod entity;
pub mod geo;
pub mod order;
pub mod projection;
pub mod query;
pub mod subscription;

pub use context::Context;
pub use query::LdQuery;

/// The kinds of error NGSI-LD names (clause 5.5.2), each with its type
/// URI and HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request's syntax is wrong (400).
    InvalidRequest,
    /// The request's data is wrong (400).
    BadRequestData,
    /// What the request creates exists already (409).
    AlreadyExists,
    /// What the request addresses does not exist (404).
    ResourceNotFound,
    /// The operation is not supported (422).
    OperationNotSupported,
    /// A remote `@context` could not be fetched or read (503).
    LdContextNotAvailable,
    /// A query would return more than weft answers at once (403).
    TooManyResults,
    /// The tenant named does not exist (404).
    NonexistentTenant,
    /// Something failed inside weft (500).
    InternalError,
    /// The body's media type is not one NGSI-LD reads (415).
    UnsupportedMediaType,
    /// None of the media types `Accept` names is served (406).
    NotAcceptable,
}

impl ErrorKind {
    /// The problem type URI of the answer's `type` member.
    pub fn type_uri(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "https://uri.etsi.org/ngsi-ld/errors/InvalidRequest",
            ErrorKind::BadRequestData => "https://uri.etsi.org/ngsi-ld/errors/BadRequestData",
            ErrorKind::AlreadyExists => "https://uri.etsi.org/ngsi-ld/errors/AlreadyExists",
            ErrorKind::ResourceNotFound => "https://uri.etsi.org/ngsi-ld/errors/ResourceNotFound",
            ErrorKind::OperationNotSupported => {
                "https://uri.etsi.org/ngsi-ld/errors/OperationNotSupported"
            }
            ErrorKind::LdContextNotAvailable => {
                "https://uri.etsi.org/ngsi-ld/errors/LdContextNotAvailable"
            }
            ErrorKind::TooManyResults => "https://uri.etsi.org/ngsi-ld/errors/TooManyResults",
            ErrorKind::NonexistentTenant => "https://uri.etsi.org/ngsi-ld/errors/NonexistentTenant",
            ErrorKind::InternalError => "https://uri.etsi.org/ngsi-ld/errors/InternalError",
            // HTTP's own refusals, which NGSI-LD names no type for.
            ErrorKind::UnsupportedMediaType | ErrorKind::NotAcceptable => {
                "https://uri.etsi.org/ngsi-ld/errors/InvalidRequest"
            }
        }
    }

    /// The HTTP status of an answer of this kind.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::BadRequestData => 400,
            ErrorKind::AlreadyExists => 409,
            ErrorKind::ResourceNotFound | ErrorKind::NonexistentTenant => 404,
            ErrorKind::OperationNotSupported => 422,
            ErrorKind::LdContextNotAvailable => 503,
            ErrorKind::TooManyResults => 403,
            ErrorKind::InternalError => 500,
            ErrorKind::UnsupportedMediaType => 415,
            ErrorKind::NotAcceptable => 406,
        }
    }

    /// The short title of an answer of this kind.
    pub fn title(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "Invalid request",
            ErrorKind::BadRequestData => "Bad request data",
            ErrorKind::AlreadyExists => "Already exists",
            ErrorKind::ResourceNotFound => "Resource not found",
            ErrorKind::OperationNotSupported => "Operation not supported",
            ErrorKind::LdContextNotAvailable => "@context not available",
            ErrorKind::TooManyResults => "Too many results",
            ErrorKind::NonexistentTenant => "Nonexistent tenant",
            ErrorKind::InternalError => "Internal error",
            ErrorKind::UnsupportedMediaType => "Unsupported media type",
            ErrorKind::NotAcceptable => "Not acceptable",
        }
    }
}

/// An NGSI-LD error: its kind and what exactly was wrong. The API renders
/// it as a problem details object (RFC 7807: `type`, `title`, `detail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdError {
    /// Which error.
    pub kind: ErrorKind,
    /// What was wrong, for a person.
    pub detail: String,
}

impl LdError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> LdError {
        LdError {
            kind,
            detail: detail.into(),
        }
    }

    /// `BadRequestData`: the data of the request is wrong.
    pub fn bad_request(detail: impl Into<String>) -> LdError {
        LdError::new(ErrorKind::BadRequestData, detail)
    }

    /// `InvalidRequest`: the request is not NGSI-LD (not JSON, wrong
    /// shape).
    pub fn invalid(detail: impl Into<String>) -> LdError {
        LdError::new(ErrorKind::InvalidRequest, detail)
    }

    /// `ResourceNotFound`.
    pub fn not_found(detail: impl Into<String>) -> LdError {
        LdError::new(ErrorKind::ResourceNotFound, detail)
    }

    /// `LdContextNotAvailable` for the context at `url`.
    pub fn context_not_available(url: impl std::fmt::Display) -> LdError {
        LdError::new(
            ErrorKind::LdContextNotAvailable,
            format!("the @context {url} could not be retrieved"),
        )
    }

    /// The problem details object of the answer.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": self.kind.type_uri(),
            "title": self.kind.title(),
            "detail": self.detail,
        })
    }
}

impl std::fmt::Display for LdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.title(), self.detail)
    }
}

impl std::error::Error for LdError {}
