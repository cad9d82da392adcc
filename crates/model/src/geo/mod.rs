//! Geometry for location attributes (`geo:json`, and Orion's simple
//! `geo:point`, `geo:line`, `geo:box`, `geo:polygon`) and for geo-queries
//! (`georel`, `geometry`, `coords`), with Orion's validation rules and
//! texts (cases 1177_geometry_and_coords, 1677_geo_location_for_api_v2,
//! 1306_string2double, 1103_order_by).
//!
//! Maths: relations (`coveredBy`, `intersects`, `equals`, `disjoint`) are
//! computed on the plane with longitude as x and latitude as y. At the
//! scale of a city or a region this differs from the spherical answer only
//! for edges that run close to a boundary, and it keeps evaluation cheap
//! and exact for the axis-aligned boxes and small polygons queries use.
//! Distances (`near`, `geo:distance`) are great-circle (haversine) distances
//! in meters on a sphere of radius [`EARTH_RADIUS_M`], from the query point
//! to the nearest vertex of the shape (0 when a polygon contains the
//! point); for points, the usual case, that is the exact distance.

#[cfg(test)]
mod tests;

use serde_json::Value;
use thiserror::Error;

/// Mean Earth radius in meters, used by the haversine distances.
pub const EARTH_RADIUS_M: f64 = 6_371_008.8;

/// A position. Fields are named so that the latitude-first order of
/// `coords` and geo:point and the longitude-first order of GeoJSON cannot
/// be confused.
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

    /// Great-circle distance to `other`, in meters.
    pub fn distance_m(self, other: Position) -> f64 {
        let (p1, p2) = (self.lat.to_radians(), other.lat.to_radians());
        let dp = p2 - p1;
        let dl = (other.lon - self.lon).to_radians();
        let a = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
        2.0 * EARTH_RADIUS_M * a.sqrt().min(1.0).asin()
    }

    fn valid(self) -> bool {
        (-90.0..=90.0).contains(&self.lat) && (-180.0..=180.0).contains(&self.lon)
    }
}

/// The geometry of a location attribute, as GeoJSON models it (a
/// `Feature` is reduced to its geometry).
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// One position.
    Point(Position),
    /// A polyline of two or more positions.
    LineString(Vec<Position>),
    /// An outer ring then holes; rings are closed (first == last).
    Polygon(Vec<Vec<Position>>),
    /// Several positions.
    MultiPoint(Vec<Position>),
    /// Several polylines.
    MultiLineString(Vec<Vec<Position>>),
    /// Several polygons.
    MultiPolygon(Vec<Vec<Vec<Position>>>),
}

/// Why a geo-query or a location value was rejected.
/// [`GeoError::description`] is Orion's text for the 400 answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", self.description())]
pub struct GeoError {
    /// What is wrong, without the `Invalid query: ` prefix (e.g.
    /// `invalid number of coordinates for /point/`).
    pub reason: String,
}

impl GeoError {
    fn new(reason: impl Into<String>) -> GeoError {
        GeoError {
            reason: reason.into(),
        }
    }

    /// Orion's description: `Invalid query: <reason>`.
    pub fn description(&self) -> String {
        format!("Invalid query: {}", self.reason)
    }
}

impl Shape {
    /// Reads a GeoJSON value (`{"type":"Point","coordinates":[lon,lat]}`,
    /// LineString, Polygon, Multi*, or a Feature, whose geometry is
    /// taken). Coordinates are longitude first; extra dimensions (altitude)
    /// are ignored.
    pub fn from_geojson(v: &Value) -> Result<Shape, GeoError> {
        let bad = |what: &str| GeoError::new(format!("invalid GeoJSON: {what}"));
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing type"))?;
        if kind == "Feature" {
            return Shape::from_geojson(v.get("geometry").ok_or_else(|| bad("missing geometry"))?);
        }
        let c = v
            .get("coordinates")
            .ok_or_else(|| bad("missing coordinates"))?;
        let shape = match kind {
            "Point" => Shape::Point(position(c).ok_or_else(|| bad("bad position"))?),
            "LineString" => Shape::LineString(line(c).ok_or_else(|| bad("bad LineString"))?),
            "Polygon" => Shape::Polygon(polygon(c).ok_or_else(|| bad("bad Polygon"))?),
            "MultiPoint" => {
                Shape::MultiPoint(each(c, position).ok_or_else(|| bad("bad MultiPoint"))?)
            }
            "MultiLineString" => {
                Shape::MultiLineString(each(c, line).ok_or_else(|| bad("bad MultiLineString"))?)
            }
            "MultiPolygon" => {
                Shape::MultiPolygon(each(c, polygon).ok_or_else(|| bad("bad MultiPolygon"))?)
            }
            other => return Err(bad(&format!("unsupported type {other}"))),
        };
        Ok(shape)
    }

    /// Reads a location attribute by its NGSI type: `geo:json` (GeoJSON),
    /// `geo:point` (`"lat, lon"`), `geo:line` and `geo:polygon` (arrays of
    /// such strings; polygons get closed), `geo:box` (two corners).
    /// `Ok(None)` when `attr_type` is not a location type.
    pub fn from_attribute(attr_type: &str, value: &Value) -> Result<Option<Shape>, GeoError> {
        let bad = || GeoError::new(format!("invalid value for {attr_type}"));
        let points = |v: &Value| -> Result<Vec<Position>, GeoError> {
            v.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|p| p.as_str().and_then(lat_lon).ok_or_else(bad))
                .collect()
        };
        let shape = match attr_type {
            "geo:json" => Shape::from_geojson(value)?,
            "geo:point" => Shape::Point(value.as_str().and_then(lat_lon).ok_or_else(bad)?),
            "geo:line" => {
                let ps = points(value)?;
                if ps.len() < 2 {
                    return Err(bad());
                }
                Shape::LineString(ps)
            }
            "geo:polygon" => Shape::Polygon(vec![closed(points(value)?).ok_or_else(bad)?]),
            "geo:box" => match points(value)?.as_slice() {
                [a, b] if a.lat != b.lat && a.lon != b.lon => {
                    Shape::Polygon(vec![box_ring(*a, *b)])
                }
                _ => return Err(bad()),
            },
            _ => return Ok(None),
        };
        Ok(Some(shape))
    }

    /// All the positions of the shape.
    fn vertices(&self) -> Vec<Position> {
        let mut out = Vec::new();
        self.parts().collect_vertices(&mut out);
        out
    }

    fn parts(&self) -> Parts {
        let mut p = Parts::default();
        match self {
            Shape::Point(a) => p.points.push(*a),
            Shape::MultiPoint(ps) => p.points.extend(ps),
            Shape::LineString(l) => p.add_line(l),
            Shape::MultiLineString(ls) => ls.iter().for_each(|l| p.add_line(l)),
            Shape::Polygon(rings) => p.add_polygon(rings.clone()),
            Shape::MultiPolygon(polys) => polys.iter().for_each(|r| p.add_polygon(r.clone())),
        }
        p
    }
}

fn position(v: &Value) -> Option<Position> {
    let a = v.as_array()?;
    if a.len() < 2 {
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

fn polygon(v: &Value) -> Option<Vec<Vec<Position>>> {
    each(v, |r| closed(each(r, position)?)).filter(|rings| !rings.is_empty())
}

/// A ring with at least three distinct positions, closed if it was not.
fn closed(mut ring: Vec<Position>) -> Option<Vec<Position>> {
    if ring.first() != ring.last() {
        ring.push(*ring.first()?);
    }
    (ring.len() >= 4).then_some(ring)
}

/// `"lat, lon"` (geo:point and `coords` order).
fn lat_lon(s: &str) -> Option<Position> {
    let (lat, lon) = s.split_once(',')?;
    let p = Position::new(lon.trim().parse().ok()?, lat.trim().parse().ok()?);
    (p.valid() && p.lat.is_finite() && p.lon.is_finite()).then_some(p)
}

fn box_ring(a: Position, b: Position) -> Vec<Position> {
    let (x0, x1) = (a.lon.min(b.lon), a.lon.max(b.lon));
    let (y0, y1) = (a.lat.min(b.lat), a.lat.max(b.lat));
    vec![
        Position::new(x0, y0),
        Position::new(x1, y0),
        Position::new(x1, y1),
        Position::new(x0, y1),
        Position::new(x0, y0),
    ]
}

/// The spatial relation of a geo-query (`georel`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GeoRel {
    /// `near;maxDistance:m` and/or `near;minDistance:m`: distance in meters
    /// from the query point, bounds inclusive.
    Near {
        /// `minDistance`, if given.
        min: Option<f64>,
        /// `maxDistance`, if given.
        max: Option<f64>,
    },
    /// The shape lies within the query polygon or box (boundary included).
    CoveredBy,
    /// The shape and the query geometry share at least one point.
    Intersects,
    /// The shape is the query geometry.
    Equals,
    /// The shape and the query geometry share no point.
    Disjoint,
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

/// A parsed geo-query, evaluated against the location of each candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct GeoQuery {
    /// The relation asked for.
    pub rel: GeoRel,
    /// The reference geometry.
    pub geometry: Geometry,
}

impl GeoQuery {
    /// Parses the three geo-query parameters (all must be given; see
    /// [`GeoQuery::from_params`] for the presence rules). `coords` are
    /// `lat,lon;lat,lon…`, latitude first.
    pub fn parse(georel: &str, geometry: &str, coords: &str) -> Result<GeoQuery, GeoError> {
        let selector = parse_selector(geometry)?;
        let positions = parse_coords(coords)?;
        let geometry = match (selector, positions.as_slice()) {
            ("point", [p]) => Geometry::Point(*p),
            ("point", _) => return Err(GeoError::new("invalid number of coordinates for /point/")),
            ("line", ps) if ps.len() >= 2 => Geometry::Line(ps.to_vec()),
            ("line", _) => return Err(GeoError::new("invalid number of coordinates for /line/")),
            ("box", [a, b]) => {
                if a.lat == b.lat || a.lon == b.lon {
                    return Err(GeoError::new(
                        "box coordinates are not defining an actual box",
                    ));
                }
                let min = Position::new(a.lon.min(b.lon), a.lat.min(b.lat));
                let max = Position::new(a.lon.max(b.lon), a.lat.max(b.lat));
                Geometry::Box { min, max }
            }
            ("box", _) => return Err(GeoError::new("invalid number of coordinates for /box/")),
            (_, ps) => Geometry::Polygon(
                closed(ps.to_vec())
                    .ok_or_else(|| GeoError::new("Too few coordinates for polygon"))?,
            ),
        };
        let rel = parse_georel(georel)?;
        match (&rel, selector) {
            (GeoRel::Near { .. }, s) if s != "point" => Err(GeoError::new(
                "georel /near/ used with geometry different than point",
            )),
            (GeoRel::CoveredBy, "point" | "line") => Err(GeoError::new(format!(
                "{selector} geometry cannot be used with coveredBy georel"
            ))),
            _ => Ok(GeoQuery { rel, geometry }),
        }
    }

    /// The query from optional URI parameters: `Ok(None)` when none is
    /// given, Orion's errors when only some are.
    pub fn from_params(
        georel: Option<&str>,
        geometry: Option<&str>,
        coords: Option<&str>,
    ) -> Result<Option<GeoQuery>, GeoError> {
        match (georel, geometry, coords) {
            (None, None, None) => Ok(None),
            (_, Some(_), None) => Err(GeoError::new("URI param /geometry/ used without /coords/")),
            (_, None, Some(_)) => Err(GeoError::new("URI param /coords/ used without /geometry/")),
            (Some(_), None, None) => {
                Err(GeoError::new("URI param /georel/ used without /geometry/"))
            }
            (rel, Some(g), Some(c)) => GeoQuery::parse(rel.unwrap_or(""), g, c).map(Some),
        }
    }

    /// Whether `shape` stands in the query's relation to its geometry.
    pub fn matches(&self, shape: &Shape) -> bool {
        match self.rel {
            GeoRel::Near { min, max } => {
                let d = self.distance_m(shape);
                min.is_none_or(|m| d >= m) && max.is_none_or(|m| d <= m)
            }
            GeoRel::Intersects => intersects(&shape.parts(), &self.parts()),
            GeoRel::Disjoint => !intersects(&shape.parts(), &self.parts()),
            GeoRel::CoveredBy => covered_by(&shape.parts(), &self.region()),
            GeoRel::Equals => self.equals(shape),
        }
    }

    /// Distance in meters from the query's reference point (the point of
    /// a point geometry, otherwise the mean of its vertices) to `shape`:
    /// 0 inside a polygon, else to its nearest vertex. This is the value
    /// `orderBy=geo:distance` sorts by.
    pub fn distance_m(&self, shape: &Shape) -> f64 {
        let from = self.reference_point();
        let parts = shape.parts();
        if parts.polygons.iter().any(|rings| in_polygon(rings, from)) {
            return 0.0;
        }
        shape
            .vertices()
            .into_iter()
            .map(|v| from.distance_m(v))
            .fold(f64::INFINITY, f64::min)
    }

    fn reference_point(&self) -> Position {
        let vs: &[Position] = match &self.geometry {
            Geometry::Point(p) => return *p,
            Geometry::Box { min, max } => {
                return Position::new((min.lon + max.lon) / 2.0, (min.lat + max.lat) / 2.0)
            }
            Geometry::Line(vs) => vs,
            // The closing vertex repeats the first one.
            Geometry::Polygon(vs) => &vs[..vs.len() - 1],
        };
        let n = vs.len() as f64;
        Position::new(
            vs.iter().map(|p| p.lon).sum::<f64>() / n,
            vs.iter().map(|p| p.lat).sum::<f64>() / n,
        )
    }

    /// The closed ring of a polygon or box geometry.
    fn region(&self) -> Vec<Position> {
        match &self.geometry {
            Geometry::Polygon(r) => r.clone(),
            Geometry::Box { min, max } => box_ring(*min, *max),
            // Parsing rejects coveredBy with points and lines.
            Geometry::Point(p) => vec![*p; 4],
            Geometry::Line(l) => l.clone(),
        }
    }

    fn parts(&self) -> Parts {
        let mut p = Parts::default();
        match &self.geometry {
            Geometry::Point(a) => p.points.push(*a),
            Geometry::Line(l) => p.add_line(l),
            Geometry::Polygon(_) | Geometry::Box { .. } => p.add_polygon(vec![self.region()]),
        }
        p
    }

    fn equals(&self, shape: &Shape) -> bool {
        match (&self.geometry, shape) {
            (Geometry::Point(a), Shape::Point(b)) => a == b,
            (Geometry::Line(a), Shape::LineString(b)) => a == b || a.iter().rev().eq(b.iter()),
            (Geometry::Polygon(_) | Geometry::Box { .. }, Shape::Polygon(rings)) => {
                rings.len() == 1 && same_ring(&self.region(), &rings[0])
            }
            _ => false,
        }
    }
}

fn parse_selector(geometry: &str) -> Result<&'static str, GeoError> {
    let mut found = None;
    let items: Vec<&str> = geometry.split(';').filter(|s| !s.is_empty()).collect();
    if items.is_empty() {
        return Err(GeoError::new("error parsing geometry: empty geometry"));
    }
    for item in items {
        let s = match item {
            "point" => "point",
            "line" => "line",
            "box" => "box",
            "polygon" => "polygon",
            _ => {
                return Err(GeoError::new(
                    "error parsing geometry: Invalid selector in geometry specification",
                ))
            }
        };
        if found.replace(s).is_some() {
            return Err(GeoError::new(
                "error parsing geometry: geometry-type present more than once",
            ));
        }
    }
    found.ok_or_else(|| GeoError::new("error parsing geometry: empty geometry"))
}

/// `lat,lon;lat,lon…` into positions.
fn parse_coords(coords: &str) -> Result<Vec<Position>, GeoError> {
    coords
        .split(';')
        .map(|pt| {
            let parts: Vec<&str> = pt.split(',').collect();
            let [lat, lon] = parts.as_slice() else {
                return Err(GeoError::new("invalid point in URI param /coords/"));
            };
            let num = |s: &str| crate::query::parse_number(s.trim());
            let p = match (num(lat), num(lon)) {
                (Some(lat), Some(lon)) => Position::new(lon, lat),
                _ => return Err(GeoError::new("invalid coordinates")),
            };
            if p.valid() {
                Ok(p)
            } else {
                Err(GeoError::new("invalid coordinates"))
            }
        })
        .collect()
}

fn parse_georel(georel: &str) -> Result<GeoRel, GeoError> {
    let mut kind: Option<&str> = None;
    let (mut min, mut max) = (None, None);
    for item in georel.split(';').filter(|s| !s.is_empty()) {
        match item {
            "near" | "coveredBy" | "intersects" | "equals" | "disjoint" => {
                if kind.replace(item).is_some() {
                    return Err(GeoError::new("georel type present more than once"));
                }
            }
            _ => {
                let (slot, name, v) = if let Some(v) = item.strip_prefix("maxDistance:") {
                    (&mut max, "maxDistance", v)
                } else if let Some(v) = item.strip_prefix("minDistance:") {
                    (&mut min, "minDistance", v)
                } else {
                    return Err(GeoError::new("Invalid modifier in georel parameter"));
                };
                if slot.is_some() {
                    return Err(GeoError::new(format!("{name} present more than once")));
                }
                let d = crate::query::parse_number(v)
                    .ok_or_else(|| GeoError::new(format!("invalid number for {name}")))?;
                *slot = Some(d);
            }
        }
    }
    let kind = kind.unwrap_or("");
    if kind != "near" {
        if max.is_some() {
            return Err(GeoError::new(format!(
                "maxDistance erroneously used with georel /{kind}/"
            )));
        }
        if min.is_some() {
            return Err(GeoError::new(format!(
                "minDistance erroneously used with georel /{kind}/"
            )));
        }
    }
    Ok(match kind {
        "near" if min.is_none() && max.is_none() => {
            return Err(GeoError::new(
                "georel /near/ without either minDistance nor maxDistance",
            ))
        }
        "near" => GeoRel::Near { min, max },
        "coveredBy" => GeoRel::CoveredBy,
        "intersects" => GeoRel::Intersects,
        "equals" => GeoRel::Equals,
        "disjoint" => GeoRel::Disjoint,
        _ => return Err(GeoError::new("georel without a relation")),
    })
}

/// Same closed ring, whatever the starting vertex and direction.
fn same_ring(a: &[Position], b: &[Position]) -> bool {
    let (a, b) = (&a[..a.len() - 1], &b[..b.len().saturating_sub(1)]);
    if a.len() != b.len() || a.is_empty() {
        return false;
    }
    let n = a.len();
    (0..n).any(|s| {
        (0..n).all(|i| a[i] == b[(s + i) % n]) || (0..n).all(|i| a[i] == b[(s + n - i) % n])
    })
}

/// A geometry broken into what the relations look at.
#[derive(Default)]
struct Parts {
    points: Vec<Position>,
    segments: Vec<(Position, Position)>,
    /// Polygons as rings (outer first, then holes).
    polygons: Vec<Vec<Vec<Position>>>,
}

impl Parts {
    fn add_line(&mut self, l: &[Position]) {
        if l.len() == 1 {
            self.points.push(l[0]);
        }
        self.segments.extend(l.windows(2).map(|w| (w[0], w[1])));
    }

    fn add_polygon(&mut self, rings: Vec<Vec<Position>>) {
        for r in &rings {
            self.add_line(r);
        }
        self.polygons.push(rings);
    }

    fn collect_vertices(&self, out: &mut Vec<Position>) {
        out.extend(&self.points);
        for (a, b) in &self.segments {
            out.push(*a);
            out.push(*b);
        }
    }

    /// Whether `p` is one of the points, on a segment, or inside a polygon.
    fn contains(&self, p: Position) -> bool {
        self.points.contains(&p)
            || self.segments.iter().any(|&(a, b)| on_segment(a, b, p))
            || self.polygons.iter().any(|rings| in_polygon(rings, p))
    }
}

fn intersects(a: &Parts, b: &Parts) -> bool {
    let mut va = Vec::new();
    a.collect_vertices(&mut va);
    let mut vb = Vec::new();
    b.collect_vertices(&mut vb);
    va.iter().any(|&p| b.contains(p))
        || vb.iter().any(|&p| a.contains(p))
        || a.segments.iter().any(|&(p, q)| {
            b.segments
                .iter()
                .any(|&(r, s)| segments_intersect(p, q, r, s))
        })
}

/// Every vertex inside or on `ring`, and no edge crossing its boundary.
fn covered_by(shape: &Parts, ring: &[Position]) -> bool {
    let mut vs = Vec::new();
    shape.collect_vertices(&mut vs);
    let region = [ring.to_vec()];
    !vs.is_empty()
        && vs.iter().all(|&p| in_polygon(&region, p))
        && shape.segments.iter().all(|&(p, q)| {
            ring.windows(2)
                .all(|w| !segments_cross_properly(p, q, w[0], w[1]))
        })
}

fn cross(o: Position, a: Position, b: Position) -> f64 {
    (a.lon - o.lon) * (b.lat - o.lat) - (a.lat - o.lat) * (b.lon - o.lon)
}

fn on_segment(a: Position, b: Position, p: Position) -> bool {
    cross(a, b, p).abs() <= 1e-12
        && p.lon >= a.lon.min(b.lon)
        && p.lon <= a.lon.max(b.lon)
        && p.lat >= a.lat.min(b.lat)
        && p.lat <= a.lat.max(b.lat)
}

fn segments_cross_properly(p: Position, q: Position, r: Position, s: Position) -> bool {
    let (d1, d2) = (cross(r, s, p), cross(r, s, q));
    let (d3, d4) = (cross(p, q, r), cross(p, q, s));
    d1 * d2 < 0.0 && d3 * d4 < 0.0
}

fn segments_intersect(p: Position, q: Position, r: Position, s: Position) -> bool {
    segments_cross_properly(p, q, r, s)
        || on_segment(r, s, p)
        || on_segment(r, s, q)
        || on_segment(p, q, r)
        || on_segment(p, q, s)
}

/// Inside the outer ring (boundary included) and not strictly inside a hole.
fn in_polygon(rings: &[Vec<Position>], p: Position) -> bool {
    let Some((outer, holes)) = rings.split_first() else {
        return false;
    };
    in_ring(outer, p)
        && holes
            .iter()
            .all(|h| !in_ring(h, p) || h.windows(2).any(|w| on_segment(w[0], w[1], p)))
}

/// Point in closed ring, boundary included (even-odd rule).
fn in_ring(ring: &[Position], p: Position) -> bool {
    if ring.windows(2).any(|w| on_segment(w[0], w[1], p)) {
        return true;
    }
    let mut inside = false;
    for w in ring.windows(2) {
        let (a, b) = (w[0], w[1]);
        if (a.lat > p.lat) != (b.lat > p.lat) {
            let x = a.lon + (p.lat - a.lat) / (b.lat - a.lat) * (b.lon - a.lon);
            if p.lon < x {
                inside = !inside;
            }
        }
    }
    inside
}
