//! Location attributes: reading the value of a `geo:json`, `geo:point`,
//! `geo:line`, `geo:box` or `geo:polygon` attribute into the geometry
//! geo-queries match, with Orion's rules and 400 texts.
//!
//! - `geo:json` takes a GeoJSON geometry (`Point`, `MultiPoint`,
//!   `LineString`, `MultiLineString`, `Polygon`, `MultiPolygon`), a
//!   `Feature` (its `geometry` is the location) or a `FeatureCollection`
//!   holding exactly one `Feature`. The value is kept and rendered as
//!   given; only the geometry is indexed. A geometry MongoDB would refuse
//!   to index (a position out of range, an open or self-crossing ring, a
//!   line of one position…) is Orion's 400 `Wrong GeoJson`.
//! - The deprecated simple-location types take `"lat, lon"` strings:
//!   `geo:point` one, `geo:line` two or more, `geo:box` the two opposite
//!   corners, `geo:polygon` four or more with the first repeated last.
//!
//! Checking a value is the same walk as reading it, so a value accepted
//! when written always yields its shape when queried.

use serde_json::{Map, Value};
use thiserror::Error;

use super::sphere::{Parts, Ring};
use super::Position;

/// The geometry of a location attribute, as it is indexed: longitude
/// first, rings as given (closed), a `geo:box` as the polygon Orion
/// stores for it. Equality is exact, as MongoDB's `equals` is.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// One position.
    Point(Position),
    /// A polyline of two or more positions.
    LineString(Vec<Position>),
    /// An outer ring then holes; every ring is closed (first == last).
    Polygon(Vec<Vec<Position>>),
    /// Several positions.
    MultiPoint(Vec<Position>),
    /// Several polylines.
    MultiLineString(Vec<Vec<Position>>),
    /// Several polygons.
    MultiPolygon(Vec<Vec<Vec<Position>>>),
}

/// Why a location attribute's value was refused; [`LocationError::description`]
/// is Orion's text for the 400 `BadRequest` answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", self.description())]
pub enum LocationError {
    /// The value breaks one of Orion's location rules (the text is Orion's,
    /// without the `error parsing location attribute: ` prefix), e.g.
    /// `geo:box uses exactly 2 coordinates`.
    Invalid(String),
    /// A `geo:json` value that is neither an object nor null.
    NotAnObject,
    /// A GeoJSON geometry MongoDB cannot index: Orion answers
    /// `Wrong GeoJson`.
    WrongGeoJson,
}

impl LocationError {
    fn invalid(reason: impl Into<String>) -> LocationError {
        LocationError::Invalid(reason.into())
    }

    /// Orion's description for the 400 answer.
    pub fn description(&self) -> String {
        match self {
            LocationError::Invalid(reason) => format!("error parsing location attribute: {reason}"),
            LocationError::NotAnObject => "geo:json needs an object or null as value".to_string(),
            LocationError::WrongGeoJson => "Wrong GeoJson".to_string(),
        }
    }
}

impl Shape {
    /// Reads a location attribute by its NGSI type. `Ok(None)` when
    /// `attr_type` is not a location type or the value is null (a null
    /// location is no location, Orion 3.1.0).
    pub fn from_attribute(attr_type: &str, value: &Value) -> Result<Option<Shape>, LocationError> {
        Shape::read(attr_type, value, Check::Full)
    }

    /// The shape of a stored location attribute, read for a query: the
    /// value was checked when it was written, so the costly checks
    /// (crossing edges) are skipped. `None` when it is no location.
    pub fn of_stored_attribute(attr_type: &str, value: &Value) -> Option<Shape> {
        Shape::read(attr_type, value, Check::Stored).ok().flatten()
    }

    fn read(attr_type: &str, value: &Value, check: Check) -> Result<Option<Shape>, LocationError> {
        if value.is_null() {
            return Ok(None);
        }
        let shape = match attr_type {
            "geo:json" => Shape::from_geo_json_value(value, check)?,
            "geo:point" => {
                let text = value.as_str().unwrap_or("");
                Shape::Point(lat_lon(text).ok_or_else(|| format_error(text))?)
            }
            "geo:line" => {
                let ps = simple_points(value)?;
                if ps.len() < 2 {
                    return Err(LocationError::invalid(
                        "geo:line uses at least 2 coordinates",
                    ));
                }
                Shape::LineString(ps)
            }
            "geo:box" => {
                let ps = simple_points(value)?;
                let [a, b] = ps.as_slice() else {
                    return Err(LocationError::invalid("geo:box uses exactly 2 coordinates"));
                };
                if a.lat == b.lat || a.lon == b.lon {
                    return Err(LocationError::invalid(
                        "geo:box coordinates are not defining an actual box",
                    ));
                }
                let (min, max) = corners(*a, *b);
                // The ring Orion stores: SW, NW, NE, SE, SW.
                Shape::Polygon(vec![vec![
                    min,
                    Position::new(min.lon, max.lat),
                    max,
                    Position::new(max.lon, min.lat),
                    min,
                ]])
            }
            "geo:polygon" => {
                let ps = simple_points(value)?;
                if ps.len() < 4 {
                    return Err(LocationError::invalid(
                        "geo:polygon uses at least 4 coordinates",
                    ));
                }
                if ps.first() != ps.last() {
                    return Err(LocationError::invalid(
                        "geo:polygon first and last coordinates must match",
                    ));
                }
                Shape::Polygon(vec![ps])
            }
            _ => return Ok(None),
        };
        Ok(Some(shape))
    }

    /// Reads a `geo:json` value: a geometry, a `Feature` or a
    /// `FeatureCollection` with one `Feature`.
    fn from_geo_json_value(value: &Value, check: Check) -> Result<Shape, LocationError> {
        let Value::Object(obj) = value else {
            return Err(LocationError::NotAnObject);
        };
        let geometry = match obj.get("type").and_then(Value::as_str) {
            Some("Feature") => feature_geometry(obj)?,
            Some("FeatureCollection") => {
                let features = match obj.get("features") {
                    None => {
                        return Err(LocationError::invalid(
                            "features field not found in FeatureCollection",
                        ))
                    }
                    Some(Value::Array(fs)) => fs,
                    Some(_) => {
                        return Err(LocationError::invalid(
                            "features in FeatureCollection is not an array",
                        ))
                    }
                };
                match features.as_slice() {
                    [] => {
                        return Err(LocationError::invalid(
                            "features in FeatureCollection has 0 items",
                        ))
                    }
                    [Value::Object(feature)] => feature_geometry(feature)?,
                    [_] => return Err(LocationError::invalid("geometry in Feature not found")),
                    _ => {
                        return Err(LocationError::invalid(
                            "features in FeatureCollection has more than 1 item",
                        ))
                    }
                }
            }
            _ => obj,
        };
        geometry_shape(geometry, check)
    }

    /// Reads a GeoJSON geometry object (`{"type":"Point","coordinates":[lon,lat]}`,
    /// LineString, Polygon, Multi*). Coordinates are longitude first;
    /// a third one (altitude) is ignored. Anything MongoDB would not index
    /// is [`LocationError::WrongGeoJson`].
    pub fn from_geojson(v: &Value) -> Result<Shape, LocationError> {
        let obj = v.as_object().ok_or(LocationError::WrongGeoJson)?;
        geometry_shape(obj, Check::Full)
    }

    /// The shape broken into points, edges and polygons.
    pub(crate) fn parts(&self) -> Parts {
        let mut p = Parts::default();
        match self {
            Shape::Point(a) => p.add_point(*a),
            Shape::MultiPoint(ps) => ps.iter().for_each(|a| p.add_point(*a)),
            Shape::LineString(l) => p.add_line(l),
            Shape::MultiLineString(ls) => ls.iter().for_each(|l| p.add_line(l)),
            Shape::Polygon(rings) => p.add_polygon(rings),
            Shape::MultiPolygon(polys) => polys.iter().for_each(|r| p.add_polygon(r)),
        }
        p
    }
}

/// How much of MongoDB's validity to check: all of it on what is written,
/// only what reading needs on what was stored.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    Full,
    Stored,
}

/// A GeoJSON geometry object into a shape.
fn geometry_shape(v: &Map<String, Value>, check: Check) -> Result<Shape, LocationError> {
    let wrong = || LocationError::WrongGeoJson;
    let kind = v.get("type").and_then(Value::as_str).ok_or_else(wrong)?;
    let c = v.get("coordinates").ok_or_else(wrong)?;
    let polygon = |c: &Value| polygon(c, check);
    let shape = match kind {
        "Point" => Shape::Point(position(c).ok_or_else(wrong)?),
        "LineString" => Shape::LineString(line(c).ok_or_else(wrong)?),
        "Polygon" => Shape::Polygon(polygon(c).ok_or_else(wrong)?),
        "MultiPoint" => Shape::MultiPoint(each(c, position).ok_or_else(wrong)?),
        "MultiLineString" => Shape::MultiLineString(each(c, line).ok_or_else(wrong)?),
        "MultiPolygon" => Shape::MultiPolygon(each(c, polygon).ok_or_else(wrong)?),
        _ => return Err(wrong()),
    };
    Ok(shape)
}

/// The `geometry` of a Feature, which must be an object.
fn feature_geometry(feature: &Map<String, Value>) -> Result<&Map<String, Value>, LocationError> {
    match feature.get("geometry") {
        Some(Value::Object(g)) => Ok(g),
        Some(_) => Err(LocationError::invalid(
            "geometry in Feature is not an object",
        )),
        None => Err(LocationError::invalid("geometry in Feature not found")),
    }
}

fn format_error(text: &str) -> LocationError {
    LocationError::invalid(format!(
        "geo coordinates format error [see Orion user manual]: {text}"
    ))
}

/// The `"lat, lon"` strings of a `geo:line`, `geo:box` or `geo:polygon`.
fn simple_points(value: &Value) -> Result<Vec<Position>, LocationError> {
    let Value::Array(items) = value else {
        return Err(LocationError::invalid(
            "geo:line, geo:box and geo:polygon needs array of strings as value",
        ));
    };
    items
        .iter()
        .map(|item| {
            let text = item.as_str().ok_or_else(|| {
                LocationError::invalid(
                    "geo:line, geo:box and geo:polygon needs array of strings but some element is not a string",
                )
            })?;
            lat_lon(text).ok_or_else(|| format_error(text))
        })
        .collect()
}

/// The south-west and north-east corners of the box two opposite corners
/// span.
pub(crate) fn corners(a: Position, b: Position) -> (Position, Position) {
    (
        Position::new(a.lon.min(b.lon), a.lat.min(b.lat)),
        Position::new(a.lon.max(b.lon), a.lat.max(b.lat)),
    )
}

/// `"lat, lon"` (the order of `geo:point` and of `coords`), both in range.
fn lat_lon(s: &str) -> Option<Position> {
    let (lat, lon) = s.split_once(',')?;
    let num = |s: &str| crate::query::parse_number(s.trim());
    let p = Position::new(num(lon)?, num(lat)?);
    p.valid().then_some(p)
}

/// A GeoJSON position: two or three numbers, longitude and latitude in
/// range.
fn position(v: &Value) -> Option<Position> {
    let a = v.as_array()?;
    if !(2..=3).contains(&a.len()) || !a.iter().all(Value::is_number) {
        return None;
    }
    let p = Position::new(a[0].as_f64()?, a[1].as_f64()?);
    p.valid().then_some(p)
}

fn each<T>(v: &Value, f: impl Fn(&Value) -> Option<T>) -> Option<Vec<T>> {
    v.as_array()?.iter().map(f).collect()
}

fn line(v: &Value) -> Option<Vec<Position>> {
    each(v, position).filter(|l| l.len() >= 2)
}

/// Rings of four or more positions, closed, with three distinct vertices
/// and no crossing edges, as MongoDB requires.
fn polygon(v: &Value, check: Check) -> Option<Vec<Vec<Position>>> {
    let rings: Vec<Vec<Position>> = each(v, |r| each(r, position))?;
    if check == Check::Stored {
        return (!rings.is_empty()).then_some(rings);
    }
    let valid = !rings.is_empty()
        && rings.iter().all(|r| {
            let mut distinct: Vec<(u64, u64)> = r
                .iter()
                .map(|p| (p.lon.to_bits(), p.lat.to_bits()))
                .collect();
            distinct.sort_unstable();
            distinct.dedup();
            r.len() >= 4
                && r.first() == r.last()
                && distinct.len() >= 3
                && (r.len() > MAX_CHECKED_RING || !Ring::new(r).self_crossing())
        });
    valid.then_some(rings)
}

/// The largest ring checked for crossing edges: the check compares every
/// edge with every other, so a bigger ring (rare in practice, and bounded
/// by the request size) is accepted unchecked rather than let one request
/// hold a worker for seconds.
const MAX_CHECKED_RING: usize = 2_000;

#[cfg(test)]
impl Shape {
    /// The square from (`x0`, `y0`) to (`x1`, `y1`) (longitude, latitude),
    /// for tests of the relations.
    pub(crate) fn square(x0: f64, y0: f64, x1: f64, y1: f64) -> Shape {
        Shape::Polygon(vec![[(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]
            .iter()
            .map(|&(x, y)| Position::new(x, y))
            .collect()])
    }
}
