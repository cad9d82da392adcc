//! NGSI-LD geo-queries (clause 4.10): `georel` (`near;maxDistance==m`,
//! `within`, `intersects`, `equals`, `disjoint`, `contains`, `overlaps`),
//! `geometry` (a GeoJSON type) and `coordinates` (GeoJSON coordinates,
//! longitude first), read into the geo-query NGSIv2 evaluates
//! ([`crate::geo::GeoQuery`]), so a relation means the same on both APIs;
//! `contains` and `overlaps`, which NGSIv2 cannot ask, are computed on
//! the plane as PostGIS does.

use serde_json::Value;

use super::{ErrorKind, LdError};
use crate::geo::{GeoQuery, GeoRel};

/// The geo-query of the three parameters, or `None` when none is given;
/// a geometry of several parts is `OperationNotSupported`.
pub fn geo_query(
    georel: Option<&str>,
    geometry: Option<&str>,
    coordinates: Option<&str>,
) -> Result<Option<GeoQuery>, LdError> {
    let (georel, geometry, coordinates) = match (georel, geometry, coordinates) {
        (None, None, None) => return Ok(None),
        (Some(r), Some(g), Some(c)) => (r, g, c),
        _ => {
            return Err(LdError::bad_request(
                "a geo-query needs georel, geometry and coordinates",
            ))
        }
    };
    // `contains` and `overlaps` are read as `intersects` (which accepts
    // every geometry), then set.
    let (rel, ld_only) = match georel {
        "contains" => ("intersects".to_string(), Some(GeoRel::Contains)),
        "overlaps" => ("intersects".to_string(), Some(GeoRel::Overlaps)),
        _ => (relation(georel)?, None),
    };
    let coords: Value = serde_json::from_str(coordinates)
        .map_err(|_| LdError::bad_request(format!("coordinates are not JSON: {coordinates}")))?;
    let (shape, points) = match geometry {
        "Point" => ("point", vec![&coords]),
        "LineString" => ("line", positions(&coords)?),
        "Polygon" => {
            let ring = coords
                .as_array()
                .and_then(|rings| rings.first())
                .ok_or_else(|| {
                    LdError::bad_request("a Polygon's coordinates are a list of rings")
                })?;
            ("polygon", positions(ring)?)
        }
        "MultiPoint" | "MultiLineString" | "MultiPolygon" => {
            return Err(LdError::new(
                ErrorKind::OperationNotSupported,
                format!("geo-queries with a {geometry} are not supported"),
            ))
        }
        other => {
            return Err(LdError::bad_request(format!(
                "geometry is a GeoJSON geometry type, not {other}"
            )))
        }
    };
    let coords = points
        .into_iter()
        .map(lat_lon)
        .collect::<Result<Vec<_>, _>>()?
        .join(";");
    let query = GeoQuery::parse(&rel, shape, &coords)
        .map_err(|e| LdError::bad_request(format!("geo-query: {}", e.reason())))?;
    Ok(Some(match ld_only {
        Some(rel) => query.with_rel(rel),
        None => query,
    }))
}

/// `georel` in NGSIv2's words.
fn relation(georel: &str) -> Result<String, LdError> {
    let mut parts = georel.split(';');
    let name = parts.next().unwrap_or("");
    let rel = match name {
        "near" => {
            let mut rel = String::from("near");
            for bound in parts {
                let (key, value) = bound
                    .split_once("==")
                    .ok_or_else(|| LdError::bad_request(format!("georel: {bound}")))?;
                if !matches!(key, "maxDistance" | "minDistance") {
                    return Err(LdError::bad_request(format!("georel: {bound}")));
                }
                rel.push_str(&format!(";{key}:{value}"));
            }
            return Ok(rel);
        }
        "within" => "coveredBy",
        "intersects" => "intersects",
        "equals" => "equals",
        "disjoint" => "disjoint",
        other => return Err(LdError::bad_request(format!("georel: {other}"))),
    };
    if parts.next().is_some() {
        return Err(LdError::bad_request(format!("georel: {georel}")));
    }
    Ok(rel.to_string())
}

/// The positions of a list of them.
fn positions(value: &Value) -> Result<Vec<&Value>, LdError> {
    value
        .as_array()
        .map(|items| items.iter().collect())
        .ok_or_else(|| LdError::bad_request("coordinates are a list of positions"))
}

/// A GeoJSON position (`[lon, lat]`) as NGSIv2 writes it (`lat,lon`).
fn lat_lon(position: &Value) -> Result<String, LdError> {
    match position.as_array().map(Vec::as_slice) {
        Some([lon, lat, ..]) if lon.is_number() && lat.is_number() => Ok(format!("{lat},{lon}")),
        _ => Err(LdError::bad_request(format!(
            "a position is [longitude, latitude]: {position}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geo::{Position, Shape};

    #[test]
    fn an_entity_contains_what_it_covers() {
        let polygon = Shape::square(0.0, 0.0, 2.0, 2.0);
        assert!(q("contains", "Point", "[1, 1]").matches(&polygon));
        assert!(!q("contains", "Point", "[3, 3]").matches(&polygon));
        let inner = "[[[0.5,0.5],[1.5,0.5],[1.5,1.5],[0.5,0.5]]]";
        assert!(q("contains", "Polygon", inner).matches(&polygon));
        let across = "[[[1,1],[3,1],[3,3],[1,1]]]";
        assert!(!q("contains", "Polygon", across).matches(&polygon));
        assert!(q("contains", "LineString", "[[0.5,0.5],[1.5,1.5]]").matches(&polygon));
        // A point covers no polygon.
        assert!(!q("contains", "Polygon", inner).matches(&Shape::Point(Position::new(1.0, 1.0))));
    }

    #[test]
    fn areas_overlap_when_they_share_points_and_neither_covers_the_other() {
        let polygon = Shape::square(0.0, 0.0, 2.0, 2.0);
        let across = "[[[1,1],[3,1],[3,3],[1,3],[1,1]]]";
        assert!(q("overlaps", "Polygon", across).matches(&polygon));
        let inner = "[[[0.5,0.5],[1.5,0.5],[1.5,1.5],[0.5,0.5]]]";
        assert!(!q("overlaps", "Polygon", inner).matches(&polygon));
        let apart = "[[[5,5],[6,5],[6,6],[5,5]]]";
        assert!(!q("overlaps", "Polygon", apart).matches(&polygon));
    }

    fn q(rel: &str, geometry: &str, coords: &str) -> GeoQuery {
        geo_query(Some(rel), Some(geometry), Some(coords))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn relations_read_as_ngsiv2_ones() {
        let porto = Shape::Point(Position::new(-8.61, 41.15));
        assert!(q("near;maxDistance==2000", "Point", "[-8.62,41.15]").matches(&porto));
        assert!(!q("near;maxDistance==200", "Point", "[-8.70,41.15]").matches(&porto));
        let square = "[[[-9,41],[-8,41],[-8,42],[-9,42],[-9,41]]]";
        assert!(q("within", "Polygon", square).matches(&porto));
        assert!(!q("disjoint", "Polygon", square).matches(&porto));
        assert!(q("intersects", "Polygon", square).matches(&porto));
    }

    #[test]
    fn what_cannot_be_read_is_refused() {
        assert_eq!(geo_query(None, None, None).unwrap(), None);
        for (rel, g, c, kind) in [
            ("near", "Point", "[1,2]", None),
            ("within", "Point", "nope", Some(ErrorKind::BadRequestData)),
            ("within", "Circle", "[1,2]", Some(ErrorKind::BadRequestData)),
            ("touches", "Point", "[1,2]", Some(ErrorKind::BadRequestData)),
            (
                "within",
                "MultiPolygon",
                "[]",
                Some(ErrorKind::OperationNotSupported),
            ),
            (
                "near;maxDistance:5",
                "Point",
                "[1,2]",
                Some(ErrorKind::BadRequestData),
            ),
        ] {
            let got = geo_query(Some(rel), Some(g), Some(c));
            match kind {
                None => assert!(got.is_err(), "near without a distance: {got:?}"),
                Some(kind) => assert_eq!(got.unwrap_err().kind, kind, "{rel} {g} {c}"),
            }
        }
        assert!(geo_query(Some("within"), None, None).is_err());
    }
}
