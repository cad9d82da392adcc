//! Geo-queries: `georel`, `geometry` and `coords`, parsed with Orion's
//! rules and texts (the URI parameters of `GET /v2/entities` and the
//! `expression` of `POST /v2/op/query` and subscriptions), and evaluated
//! against a location [`Shape`] with MongoDB's spherical semantics.
//!
//! Parsing follows Orion's order, which decides which error a request
//! with several mistakes gets: the geometry selector, then the relation,
//! then the combinations that cannot work (`coveredBy` a point or a line,
//! `near` anything but a point), then the coordinates, then their count.

use thiserror::Error;

use super::location::corners;
use super::sphere::{Parts, Ring};
use super::{Position, Shape};

/// The spatial relation of a geo-query (`georel`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GeoRel {
    /// `near;maxDistance:m` and/or `near;minDistance:m`: distance in meters
    /// from the query point to the nearest point of the location, bounds
    /// inclusive.
    Near {
        /// `minDistance`, if given.
        min: Option<f64>,
        /// `maxDistance`, if given.
        max: Option<f64>,
    },
    /// The location lies within the query polygon or box (border included).
    CoveredBy,
    /// The location and the query geometry share at least one point.
    Intersects,
    /// The location is exactly the query geometry (same type, same
    /// positions in the same order), as MongoDB compares them.
    Equals,
    /// The location and the query geometry share no point.
    Disjoint,
    /// The location covers the query geometry (NGSI-LD's `contains`;
    /// NGSIv2 has no word for it). Computed on the plane, as PostGIS's
    /// `ST_Covers` does.
    Contains,
    /// The location and the query geometry share points without either
    /// covering the other (NGSI-LD's `overlaps`, on the plane).
    Overlaps,
}

/// The reference geometry of a geo-query (`geometry` + `coords`).
#[derive(Debug, Clone, PartialEq)]
pub enum Geometry {
    /// `geometry=point`, one position.
    Point(Position),
    /// `geometry=line`, two or more positions.
    Line(Vec<Position>),
    /// `geometry=polygon`, a closed ring.
    Polygon(Vec<Position>),
    /// `geometry=box`, two opposite corners (normalized: `min` is the
    /// south-west corner, `max` the north-east one).
    Box {
        /// South-west corner.
        min: Position,
        /// North-east corner.
        max: Position,
    },
}

impl Geometry {
    /// The geometry as the shape Orion hands MongoDB: a box becomes the
    /// polygon SW, SE, NE, NW, SW.
    fn shape(&self) -> Shape {
        match self {
            Geometry::Point(p) => Shape::Point(*p),
            Geometry::Line(l) => Shape::LineString(l.clone()),
            Geometry::Polygon(r) => Shape::Polygon(vec![r.clone()]),
            Geometry::Box { min, max } => Shape::Polygon(vec![box_ring(*min, *max)]),
        }
    }
}

/// The closed ring of a box, counter-clockwise from its south-west corner.
fn box_ring(min: Position, max: Position) -> Vec<Position> {
    vec![
        min,
        Position::new(max.lon, min.lat),
        max,
        Position::new(min.lon, max.lat),
        min,
    ]
}

/// Why a geo-query was refused; [`GeoError::description`] is Orion's text
/// for the 400 `BadRequest` answer, which depends on where the query came
/// from.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", self.description())]
pub enum GeoError {
    /// From URI parameters: `Invalid query: <reason>`.
    Uri(String),
    /// From a JSON `expression`: `error parsing geo-query fields: <reason>`.
    Expression(String),
    /// A JSON `expression` with some of `georel`, `geometry`, `coords` but
    /// not all three.
    PartialExpression,
}

impl GeoError {
    /// What is wrong, without the prefix of its origin (e.g. `invalid
    /// number of coordinates for /point/`).
    pub fn reason(&self) -> &str {
        match self {
            GeoError::Uri(r) | GeoError::Expression(r) => r,
            GeoError::PartialExpression => {
                "partial geo expression: geometry, georel and coords have to be provided together"
            }
        }
    }

    /// Orion's description for the 400 answer.
    pub fn description(&self) -> String {
        match self {
            GeoError::Uri(r) => format!("Invalid query: {r}"),
            GeoError::Expression(r) => format!("error parsing geo-query fields: {r}"),
            GeoError::PartialExpression => self.reason().to_string(),
        }
    }

    fn into_expression(self) -> GeoError {
        match self {
            GeoError::Uri(r) => GeoError::Expression(r),
            other => other,
        }
    }
}

fn fail<T>(reason: impl Into<String>) -> Result<T, GeoError> {
    Err(GeoError::Uri(reason.into()))
}

/// A parsed geo-query, evaluated against the location of each candidate.
/// The reference geometry is prepared once (as the shape MongoDB would
/// get, its edges and its region) for all the candidates.
#[derive(Debug, Clone)]
pub struct GeoQuery {
    rel: GeoRel,
    geometry: Geometry,
    shape: Shape,
    parts: Parts,
    region: Option<Ring>,
    surface: Surface,
}

/// Where a query's relations are computed: on the sphere, as Orion's
/// MongoDB does, or on the plane of longitude and latitude, as
/// QuantumLeap's PostGIS does ([`super::plane`]). Distances (`near`) are
/// on the sphere either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Surface {
    Sphere,
    Plane,
}

impl PartialEq for GeoQuery {
    fn eq(&self, other: &GeoQuery) -> bool {
        self.rel == other.rel && self.geometry == other.geometry
    }
}

impl GeoQuery {
    /// A query for `rel` to `geometry`, prepared for matching.
    pub fn new(rel: GeoRel, geometry: Geometry) -> GeoQuery {
        let shape = geometry.shape();
        let parts = shape.parts();
        let region = match &geometry {
            Geometry::Polygon(ring) => Some(Ring::new(ring)),
            Geometry::Box { min, max } => Some(Ring::new(&box_ring(*min, *max))),
            Geometry::Point(_) | Geometry::Line(_) => None,
        };
        GeoQuery {
            rel,
            geometry,
            shape,
            parts,
            region,
            surface: Surface::Sphere,
        }
    }

    /// The relation asked for.
    pub fn rel(&self) -> GeoRel {
        self.rel
    }

    /// The reference geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Parses the three geo-query parameters (see
    /// [`GeoQuery::from_params`] for the presence rules). `coords` are
    /// `lat,lon;lat,lon…`, latitude first. A `georel` that names no
    /// relation (`maxDistance`/`minDistance` aside) is refused here; the
    /// URI form accepts it and filters nothing.
    pub fn parse(georel: &str, geometry: &str, coords: &str) -> Result<GeoQuery, GeoError> {
        match parse(georel, geometry, coords, Surface::Sphere)? {
            Some(q) => Ok(q),
            None => fail("georel without a relation"),
        }
    }

    /// The query from optional URI parameters as Orion reads them
    /// (`GET /v2/entities`): `Ok(None)` when none is given, and when
    /// `georel` is missing (Orion checks `geometry` and `coords`, then
    /// filters nothing); Orion's errors when only some are given.
    pub fn from_ngsi_params(
        georel: Option<&str>,
        geometry: Option<&str>,
        coords: Option<&str>,
    ) -> Result<Option<GeoQuery>, GeoError> {
        match (georel, geometry, coords) {
            (None, None, None) => Ok(None),
            (_, Some(_), None) => fail("URI param /geometry/ used without /coords/"),
            (_, None, Some(_)) => fail("URI param /coords/ used without /geometry/"),
            (Some(_), None, None) => fail("URI param /georel/ used without /geometry/"),
            (rel, Some(g), Some(c)) => parse(rel.unwrap_or(""), g, c, Surface::Sphere),
        }
    }

    /// The query from optional URI parameters where a geo-query needs all
    /// three (QuantumLeap's history queries): as
    /// [`GeoQuery::from_ngsi_params`], except that `geometry` and `coords`
    /// without a relation are refused, and that relations are computed on
    /// the plane, as QuantumLeap's PostGIS computes them (so `coveredBy`
    /// a line or a point is a question with an answer).
    pub fn from_params(
        georel: Option<&str>,
        geometry: Option<&str>,
        coords: Option<&str>,
    ) -> Result<Option<GeoQuery>, GeoError> {
        let found = match (georel, geometry, coords) {
            (Some(r), Some(g), Some(c)) => parse(r, g, c, Surface::Plane)?,
            _ => GeoQuery::from_ngsi_params(georel, geometry, coords)?,
        };
        match found {
            None if geometry.is_some() => fail("georel without a relation"),
            found => Ok(found),
        }
    }

    /// The query from the fields of a JSON `expression` (op/query,
    /// subscriptions): all three or none, each non-empty (the caller
    /// checks they are strings and not empty, with Orion's texts).
    pub fn from_expression(
        georel: Option<&str>,
        geometry: Option<&str>,
        coords: Option<&str>,
    ) -> Result<Option<GeoQuery>, GeoError> {
        match (georel, geometry, coords) {
            (None, None, None) => Ok(None),
            (Some(r), Some(g), Some(c)) => {
                parse(r, g, c, Surface::Sphere).map_err(GeoError::into_expression)
            }
            _ => Err(GeoError::PartialExpression),
        }
    }

    /// Whether `shape` stands in the query's relation to its geometry.
    pub fn matches(&self, shape: &Shape) -> bool {
        if self.surface == Surface::Plane {
            match self.rel {
                GeoRel::Intersects => return super::plane::intersects(shape, &self.shape),
                GeoRel::Disjoint => return !super::plane::intersects(shape, &self.shape),
                GeoRel::CoveredBy => return super::plane::covered_by(shape, &self.shape),
                GeoRel::Near { .. } | GeoRel::Equals | GeoRel::Contains | GeoRel::Overlaps => {}
            }
        }
        match self.rel {
            GeoRel::Near { min, max } => {
                // Orion passes only non-negative bounds on to its
                // database: `maxDistance:-1` bounds nothing.
                let d = self.distance_m(shape);
                min.is_none_or(|m| m < 0.0 || d >= m) && max.is_none_or(|m| m < 0.0 || d <= m)
            }
            GeoRel::Intersects => shape.parts().intersects(&self.parts),
            GeoRel::Disjoint => !shape.parts().intersects(&self.parts),
            // Parsing refuses coveredBy with points and lines.
            GeoRel::CoveredBy => self
                .region
                .as_ref()
                .is_some_and(|region| shape.parts().covered_by(region)),
            GeoRel::Equals => *shape == self.shape,
            GeoRel::Contains => super::plane::covered_by(&self.shape, shape),
            GeoRel::Overlaps => {
                super::plane::intersects(shape, &self.shape)
                    && !super::plane::covered_by(shape, &self.shape)
                    && !super::plane::covered_by(&self.shape, shape)
            }
        }
    }

    /// This query with relation `rel` instead (NGSI-LD's relations that
    /// NGSIv2's parameters cannot name).
    pub fn with_rel(self, rel: GeoRel) -> GeoQuery {
        GeoQuery { rel, ..self }
    }

    /// Distance in meters from the query point to the nearest point of
    /// `shape` (0 inside a polygon): what `near` bounds and
    /// `orderBy=geo:distance` sorts by. Only point geometries have one
    /// (Orion sorts by distance only for `near`); other geometries give 0,
    /// which keeps the listing's own order.
    pub fn distance_m(&self, shape: &Shape) -> f64 {
        match &self.geometry {
            Geometry::Point(p) => shape.parts().distance_m(*p),
            _ => 0.0,
        }
    }
}

/// Parses a geo-query in Orion's order; `None` when `georel` names no
/// relation (Orion accepts that, checks the rest, and filters nothing).
fn parse(
    georel: &str,
    geometry: &str,
    coords: &str,
    surface: Surface,
) -> Result<Option<GeoQuery>, GeoError> {
    let selector = parse_selector(geometry)?;
    let rel = if georel.is_empty() {
        None
    } else {
        parse_georel(georel)?
    };
    match (rel, selector) {
        (Some(GeoRel::CoveredBy), "line" | "point") if surface == Surface::Sphere => {
            return fail(format!(
                "{selector} geometry cannot be used with coveredBy georel"
            ))
        }
        (Some(GeoRel::Near { .. }), s) if s != "point" => {
            return fail("georel /near/ used with geometry different than point")
        }
        _ => {}
    }
    let positions = parse_coords(coords)?;
    let geometry = match (selector, positions.as_slice()) {
        ("polygon", ps) if ps.len() < 4 => return fail("Too few coordinates for polygon"),
        ("polygon", ps) if ps.first() != ps.last() => {
            return fail("First and last point in polygon not the same")
        }
        ("polygon", ps) => Geometry::Polygon(ps.to_vec()),
        ("line", ps) if ps.len() < 2 => return fail("invalid number of coordinates for /line/"),
        ("line", ps) => Geometry::Line(ps.to_vec()),
        ("box", [a, b]) => {
            if a.lat == b.lat || a.lon == b.lon {
                return fail("box coordinates are not defining an actual box");
            }
            let (min, max) = corners(*a, *b);
            Geometry::Box { min, max }
        }
        ("box", _) => return fail("invalid number of coordinates for /box/"),
        (_, [p]) => Geometry::Point(*p),
        (_, _) => return fail("invalid number of coordinates for /point/"),
    };
    Ok(rel.map(|rel| GeoQuery {
        surface,
        ..GeoQuery::new(rel, geometry)
    }))
}

fn parse_selector(geometry: &str) -> Result<&'static str, GeoError> {
    let mut found = None;
    let items = orion_split(geometry, ';');
    if items.is_empty() {
        return fail("error parsing geometry: empty geometry");
    }
    for item in items {
        let s = match item {
            "point" => "point",
            "line" => "line",
            "box" => "box",
            "polygon" => "polygon",
            _ => return fail("error parsing geometry: Invalid selector in geometry specification"),
        };
        if found.replace(s).is_some() {
            return fail("error parsing geometry: geometry-type present more than once");
        }
    }
    found.map_or_else(|| fail("error parsing geometry: empty geometry"), Ok)
}

/// Splits as Orion's `stringSplit` does, which decides what an empty piece
/// means: leading delimiters are skipped, nothing else is (`point;` is
/// `point` and an empty, invalid selector).
fn orion_split(s: &str, delimiter: char) -> Vec<&str> {
    let s = s.trim_start_matches(delimiter);
    if s.is_empty() {
        Vec::new()
    } else {
        s.split(delimiter).collect()
    }
}

/// `lat,lon;lat,lon…` into positions.
fn parse_coords(coords: &str) -> Result<Vec<Position>, GeoError> {
    if coords.is_empty() {
        return fail("no coordinates for geometry");
    }
    let points = orion_split(coords, ';');
    if points.is_empty() {
        return fail("erroneous coordinates for geometry");
    }
    points
        .into_iter()
        .map(|pt| {
            let parts = orion_split(pt, ',');
            let [lat, lon] = parts.as_slice() else {
                return fail("invalid point in URI param /coords/");
            };
            let num = |s: &str| crate::query::parse_number(s.trim());
            match (num(lat), num(lon)) {
                (Some(lat), Some(lon)) if Position::new(lon, lat).valid() => {
                    Ok(Position::new(lon, lat))
                }
                _ => fail("invalid coordinates"),
            }
        })
        .collect()
}

/// The relation, `None` when `georel` names none (only possible without
/// distance modifiers, which need `near`).
fn parse_georel(georel: &str) -> Result<Option<GeoRel>, GeoError> {
    let mut kind: Option<&str> = None;
    let (mut min, mut max) = (None, None);
    let items = orion_split(georel, ';');
    if items.is_empty() {
        return fail("empty georel");
    }
    for item in items {
        match item {
            "near" | "coveredBy" | "intersects" | "equals" | "disjoint" => {
                if kind.replace(item).is_some() {
                    return fail("georel type present more than once");
                }
            }
            _ => {
                let (slot, name, v) = if let Some(v) = item.strip_prefix("maxDistance:") {
                    (&mut max, "maxDistance", v)
                } else if let Some(v) = item.strip_prefix("minDistance:") {
                    (&mut min, "minDistance", v)
                } else {
                    return fail("Invalid modifier in georel parameter");
                };
                if slot.is_some() {
                    return fail(format!("{name} present more than once"));
                }
                let d = crate::query::parse_number(v)
                    .ok_or_else(|| GeoError::Uri(format!("invalid number for {name}")))?;
                *slot = Some(d);
            }
        }
    }
    let kind = kind.unwrap_or("");
    if kind != "near" {
        if max.is_some() {
            return fail(format!("maxDistance erroneously used with georel /{kind}/"));
        }
        if min.is_some() {
            return fail(format!("minDistance erroneously used with georel /{kind}/"));
        }
    }
    Ok(Some(match kind {
        "near" if min.is_none() && max.is_none() => {
            return fail("georel /near/ without either minDistance nor maxDistance")
        }
        "near" => GeoRel::Near { min, max },
        "coveredBy" => GeoRel::CoveredBy,
        "intersects" => GeoRel::Intersects,
        "equals" => GeoRel::Equals,
        "disjoint" => GeoRel::Disjoint,
        _ => return Ok(None),
    }))
}
