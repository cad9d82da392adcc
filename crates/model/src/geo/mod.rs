//! Geometry for location attributes (`geo:json`, and Orion's deprecated
//! `geo:point`, `geo:line`, `geo:box`, `geo:polygon`) and for geo-queries
//! (`georel`, `geometry`, `coords`), with Orion's validation rules and
//! texts and the answers Orion's database (MongoDB, `2dsphere`) gives.
//!
//! - [`location`]: reading and validating a location attribute's value
//!   into a [`Shape`].
//! - [`query`]: parsing a geo-query into a [`GeoQuery`] and matching
//!   shapes against it.
//! - [`sphere`]: the spherical maths both rely on: edges are great-circle
//!   arcs, distances are great-circle distances in meters.
//! - [`plane`]: the relations on the plane of longitude and latitude, as
//!   QuantumLeap's PostGIS computes them, for history queries.

mod location;
mod plane;
mod query;
mod sphere;
#[cfg(test)]
mod tests;

pub use location::{LocationError, Shape};
pub use query::{GeoError, GeoQuery, GeoRel, Geometry};
pub use sphere::EARTH_RADIUS_M;

/// A position. Fields are named so that the latitude-first order of
/// `coords` and `geo:point` and the longitude-first order of GeoJSON
/// cannot be confused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    /// Longitude in degrees, -180..=180.
    pub lon: f64,
    /// Latitude in degrees, -90..=90.
    pub lat: f64,
}

impl Position {
    /// A position from longitude and latitude, in that (GeoJSON) order.
    pub fn new(lon: f64, lat: f64) -> Position {
        Position { lon, lat }
    }

    /// Great-circle distance to `other`, in meters (on MongoDB's sphere,
    /// [`EARTH_RADIUS_M`]).
    pub fn distance_m(self, other: Position) -> f64 {
        sphere::distance_m(self, other)
    }

    /// Whether both coordinates are finite and in range.
    fn valid(self) -> bool {
        (-90.0..=90.0).contains(&self.lat) && (-180.0..=180.0).contains(&self.lon)
    }
}
