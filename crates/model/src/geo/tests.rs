//! Unit tests of geometry parsing and geo-query evaluation; cases cited are
//! Orion's functional tests.

use serde_json::json;

use super::*;

fn q(georel: &str, geometry: &str, coords: &str) -> GeoQuery {
    GeoQuery::parse(georel, geometry, coords).unwrap()
}

fn err(georel: &str, geometry: &str, coords: &str) -> String {
    GeoQuery::parse(georel, geometry, coords)
        .unwrap_err()
        .description()
}

/// `geo:point` "lat, lon".
fn pt(lat: f64, lon: f64) -> Shape {
    Shape::Point(Position::new(lon, lat))
}

#[test]
fn great_circle_hand_computed() {
    // One degree of latitude on MongoDB's sphere: pi * 6378.1 km / 180.
    let d = Position::new(0.0, 0.0).distance_m(Position::new(0.0, 1.0));
    assert!((d - 111_318.85).abs() < 0.1, "{d}");
    // One degree of longitude at 60°N is half of that at the equator
    // (to 0.01%: the chord of a small arc).
    let d = Position::new(0.0, 60.0).distance_m(Position::new(1.0, 60.0));
    assert!((d - 55_659.0).abs() < 10.0, "{d}");
    assert_eq!(
        Position::new(3.0, 4.0).distance_m(Position::new(3.0, 4.0)),
        0.0
    );
}

#[test]
fn near_madrid() {
    // 1177_geometry_and_coords/geometry_and_coords.test steps 05-08.
    let madrid = pt(40.418889, -3.691944);
    let leganes = pt(40.316667, -3.75);
    let alcobendas = pt(40.533333, -3.633333);
    let center = "40.418889,-3.691944";
    let sel = |georel: &str| -> Vec<bool> {
        let gq = q(georel, "point", center);
        [&madrid, &leganes, &alcobendas]
            .iter()
            .map(|s| gq.matches(s))
            .collect()
    };
    assert_eq!(sel("near;maxDistance:15000"), [true, true, true]);
    assert_eq!(sel("near;maxDistance:13500"), [true, true, false]);
    assert_eq!(sel("near;maxDistance:1000"), [true, false, false]);
    assert_eq!(sel("near;minDistance:1000"), [false, true, true]);
    assert_eq!(
        sel("near;minDistance:1000;maxDistance:13500"),
        [false, true, false]
    );
}

#[test]
fn polygons_around_madrid() {
    // 1177_geometry_and_coords/geometry_and_coords.test steps 09-16.
    let cities = [
        pt(40.418889, -3.691944),
        pt(40.316667, -3.75),
        pt(40.533333, -3.633333),
    ];
    let sel = |georel: &str, coords: &str| -> Vec<bool> {
        let gq = q(georel, "polygon", coords);
        cities.iter().map(|s| gq.matches(s)).collect()
    };
    let leganes = "40.316667,-3.65;40.216667,-3.85;40.416667,-3.85;40.316667,-3.65";
    assert_eq!(sel("coveredBy", leganes), [false, true, false]);
    assert_eq!(sel("disjoint", leganes), [true, false, true]);
    let alcobendas =
        "40.533333,-3.533333;40.433333,-3.733333;40.633333,-3.733333;40.533333,-3.533333";
    assert_eq!(sel("coveredBy", alcobendas), [false, false, true]);
    let madrid = "40.418889,-3.591944;40.318889,-3.791944;40.518889,-3.791944;40.418889,-3.591944";
    assert_eq!(sel("coveredBy", madrid), [true, false, false]);
    let all = "40,-3;36,-4;44,-4;40,-3";
    assert_eq!(sel("coveredBy", all), [true, true, true]);
    assert_eq!(sel("disjoint", all), [false, false, false]);
}

#[test]
fn relations_on_points() {
    // 1677_geo_location_for_api_v2/geoquery_points.test: A(5,5) B(9,5)
    // C(15,5) D(15,15) E(-4,10), all "lat, lon".
    let shapes = [
        pt(5.0, 5.0),
        pt(9.0, 5.0),
        pt(15.0, 5.0),
        pt(15.0, 15.0),
        pt(-4.0, 10.0),
    ];
    let sel = |georel: &str, geometry: &str, coords: &str| -> String {
        let gq = q(georel, geometry, coords);
        shapes
            .iter()
            .zip("ABCDE".chars())
            .filter(|(s, _)| gq.matches(s))
            .map(|(_, c)| c)
            .collect()
    };
    let tri = "0,0;24,0;0,20;0,0";
    assert_eq!(sel("coveredBy", "box", "-5,0;6,11"), "AE");
    assert_eq!(sel("coveredBy", "box", "-5,11;6,0"), "AE");
    assert_eq!(sel("coveredBy", "polygon", tri), "ABC");
    assert_eq!(sel("intersects", "point", "5,5"), "A");
    assert_eq!(sel("intersects", "line", "5,5;9,5"), "AB");
    assert_eq!(sel("intersects", "box", "-5,0;6,11"), "AE");
    assert_eq!(sel("intersects", "polygon", tri), "ABC");
    assert_eq!(sel("disjoint", "point", "5,5"), "BCDE");
    assert_eq!(sel("disjoint", "line", "5,5;9,5"), "CDE");
    assert_eq!(sel("disjoint", "box", "-5,11;6,0"), "BCD");
    assert_eq!(sel("disjoint", "polygon", tri), "DE");
    assert_eq!(sel("equals", "point", "15,15"), "D");
    assert_eq!(sel("equals", "line", "5,5;9,5"), "");
    assert_eq!(sel("equals", "box", "-5,0;6,11"), "");
    assert_eq!(sel("equals", "polygon", tri), "");
}

#[test]
fn order_by_distance() {
    // 1103_order_by/order_by_proximity.test: from Spain's centre,
    // Madrid, Guadalajara, Zaragoza, Lleida, Barcelona.
    let gq = q("near;maxDistance:700000", "point", "40.641944,-4.155278");
    let mut cities = [
        ("Barcelona", pt(41.3825, 2.176944)),
        ("Guadalajara", pt(40.633333, -3.166667)),
        ("Lleida", pt(41.616667, 0.633333)),
        ("Madrid", pt(40.418889, -3.691944)),
        ("Zaragoza", pt(41.65, -0.883333)),
    ];
    assert!(cities.iter().all(|(_, s)| gq.matches(s)));
    cities.sort_by(|a, b| gq.distance_m(&a.1).total_cmp(&gq.distance_m(&b.1)));
    let names: Vec<_> = cities.iter().map(|c| c.0).collect();
    assert_eq!(
        names,
        ["Madrid", "Guadalajara", "Zaragoza", "Lleida", "Barcelona"]
    );
}

#[test]
fn lines_and_polygons_as_shapes() {
    // Square lon 0..10, lat 0..10 (GeoJSON, lon first).
    let square = Shape::from_geojson(&json!({"type": "Polygon",
        "coordinates": [[[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]]]}))
    .unwrap();
    // A point inside the square: intersects, not disjoint, distance 0.
    assert!(q("intersects", "point", "5,5").matches(&square));
    assert!(!q("disjoint", "point", "5,5").matches(&square));
    assert_eq!(
        q("near;maxDistance:1", "point", "5,5").distance_m(&square),
        0.0
    );
    // A box containing the square covers it; a smaller one only intersects.
    assert!(q("coveredBy", "box", "-1,-1;11,11").matches(&square));
    assert!(q("coveredBy", "box", "0,0;10,10").matches(&square));
    assert!(!q("coveredBy", "box", "1,1;11,11").matches(&square));
    assert!(q("intersects", "box", "1,1;11,11").matches(&square));
    // A line crossing the square with no vertex inside still intersects.
    assert!(q("intersects", "line", "5,-5;5,15").matches(&square));
    assert!(q("disjoint", "line", "20,-5;20,15").matches(&square));
    // equals is MongoDB's: the same positions in the same order. The box
    // 0,0;10,10 is the ring SW, SE, NE, NW, which is how the square was
    // written; the same ring from another vertex is another geometry.
    assert!(q("equals", "polygon", "0,0;0,10;10,10;10,0;0,0").matches(&square));
    assert!(!q("equals", "polygon", "10,10;0,10;0,0;10,0;10,10").matches(&square));
    assert!(q("equals", "box", "0,0;10,10").matches(&square));
    // Lines: crossing lines intersect; a line sticking out is not covered.
    let line = Shape::from_geojson(&json!({"type": "LineString",
        "coordinates": [[0, 0], [10, 10]]}))
    .unwrap();
    assert!(q("intersects", "line", "0,10;10,0").matches(&line));
    assert!(q("equals", "line", "0,0;10,10").matches(&line));
    assert!(!q("equals", "line", "10,10;0,0").matches(&line));
    assert!(q("coveredBy", "polygon", "-1,-1;-1,11;11,11;11,-1;-1,-1").matches(&line));
    // A concave polygon: the square lon 0..10, lat 0..10 without the notch
    // lon 3..10, lat 3..7 (a U lying on its side). The line at lon 5 from
    // lat 1 to lat 9 has both ends inside but crosses the notch, so it is
    // not covered.
    let u = "0,0;10,0;10,10;7,10;7,3;3,3;3,10;0,10;0,0";
    let across = Shape::from_geojson(&json!({"type": "LineString",
        "coordinates": [[5, 1], [5, 9]]}))
    .unwrap();
    assert!(!q("coveredBy", "polygon", u).matches(&across));
    assert!(q("intersects", "polygon", u).matches(&across));
    // Near a line: distance to its nearest point, here inside the edge
    // (about 0.71 degrees from lat 0, lon 1, the edge being a great
    // circle), not to its nearest vertex (1 degree away).
    let d = q("near;maxDistance:1", "point", "0,1").distance_m(&line);
    assert!((d - 79_312.5).abs() < 1.0, "{d}");
}

#[test]
fn polygon_holes() {
    let donut = Shape::from_geojson(&json!({"type": "Polygon", "coordinates": [
        [[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]],
        [[3, 3], [7, 3], [7, 7], [3, 7], [3, 3]]]}))
    .unwrap();
    assert!(!q("intersects", "point", "5,5").matches(&donut));
    assert!(q("intersects", "point", "1,1").matches(&donut));
    assert!(q("intersects", "point", "3,5").matches(&donut));
}

#[test]
fn geojson_kinds() {
    let feature = json!({"type": "Feature", "properties": {},
        "geometry": {"type": "Point", "coordinates": [-3.69, 40.41]}});
    assert_eq!(
        Shape::from_attribute("geo:json", &feature).unwrap(),
        Some(Shape::Point(Position::new(-3.69, 40.41)))
    );
    let mp = json!({"type": "MultiPoint", "coordinates": [[1, 2], [3, 4, 100]]});
    assert_eq!(
        Shape::from_geojson(&mp).unwrap(),
        Shape::MultiPoint(vec![Position::new(1.0, 2.0), Position::new(3.0, 4.0)])
    );
    let mls = json!({"type": "MultiLineString", "coordinates": [[[0, 0], [1, 1]]]});
    assert!(matches!(
        Shape::from_geojson(&mls).unwrap(),
        Shape::MultiLineString(_)
    ));
    let mpoly = json!({"type": "MultiPolygon", "coordinates": [
        [[[0, 0], [1, 0], [1, 1], [0, 0]]], [[[5, 5], [6, 5], [6, 6], [5, 5]]]]});
    let mpoly = Shape::from_geojson(&mpoly).unwrap();
    assert!(q("intersects", "point", "5.2,5.5").matches(&mpoly));
    assert!(q("disjoint", "point", "3,3").matches(&mpoly));
    for bad in [
        json!({"type": "Point", "coordinates": [1]}),
        json!({"type": "Point", "coordinates": [200, 0]}),
        json!({"type": "LineString", "coordinates": [[1, 2]]}),
        json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 1]]]}),
        json!({"type": "Circle", "coordinates": [0, 0]}),
        json!({"coordinates": [0, 0]}),
        json!("5, 5"),
    ] {
        assert!(Shape::from_geojson(&bad).is_err(), "{bad}");
    }
}

#[test]
fn simple_location_types() {
    assert_eq!(
        Shape::from_attribute("geo:point", &json!("40.41, -3.69")).unwrap(),
        Some(Shape::Point(Position::new(-3.69, 40.41)))
    );
    assert!(Shape::from_attribute("geo:point", &json!("40.41")).is_err());
    assert!(Shape::from_attribute("geo:point", &json!("91, 0")).is_err());
    let line = Shape::from_attribute("geo:line", &json!(["0, 0", "1, 1"])).unwrap();
    assert!(matches!(line, Some(Shape::LineString(ref l)) if l.len() == 2));
    let poly = Shape::from_attribute("geo:polygon", &json!(["0, 0", "0, 1", "1, 1", "0, 0"]))
        .unwrap()
        .unwrap();
    assert!(matches!(poly, Shape::Polygon(ref r) if r[0].len() == 4));
    let bx = Shape::from_attribute("geo:box", &json!(["0, 0", "1, 1"]))
        .unwrap()
        .unwrap();
    // Orion stores a geo:box as SW, NW, NE, SE and queries a box as SW,
    // SE, NE, NW: the same area, never `equals`.
    assert!(!q("equals", "box", "1,1;0,0").matches(&bx));
    assert!(q("coveredBy", "box", "1,1;0,0").matches(&bx));
    assert!(q("intersects", "point", "0.5,0.5").matches(&bx));
    assert_eq!(Shape::from_attribute("Text", &json!("x")).unwrap(), None);
}

#[test]
fn orion_validation_texts() {
    // 1177_geometry_and_coords/geometry_and_coords_errors.test
    assert_eq!(
        err("intersect", "noCirle", "-1,2"),
        "Invalid query: error parsing geometry: Invalid selector in geometry specification"
    );
    assert_eq!(
        err("intersects", "polygon", "1,2;2,2"),
        "Invalid query: Too few coordinates for polygon"
    );
    assert_eq!(
        err("near;maxDistance:10", "point", "1,2;2,2"),
        "Invalid query: invalid number of coordinates for /point/"
    );
    assert_eq!(
        err("near", "point", "1.0,2.0"),
        "Invalid query: georel /near/ without either minDistance nor maxDistance"
    );
    assert!(GeoQuery::parse("intersects", "polygon", "1,2;2,2;2,1;1,2").is_ok());
    // 1677_geo_location_for_api_v2/geo_location_for_api_v2_error_cases.test
    assert_eq!(
        err("intersects", "triangle", "1,2"),
        "Invalid query: error parsing geometry: Invalid selector in geometry specification"
    );
    for (g, c) in [
        ("box", "1,2;3,4"),
        ("polygon", "1,2;3,4;3,0;1,0;1,2"),
        ("line", "1,2;3,4"),
    ] {
        assert_eq!(
            err("near;maxDistance:12", g, c),
            "Invalid query: georel /near/ used with geometry different than point"
        );
    }
    assert_eq!(
        err("near", "point", "1,2"),
        "Invalid query: georel /near/ without either minDistance nor maxDistance"
    );
    for c in ["1,2,3", "1;3,4"] {
        assert_eq!(
            err("intersects", "point", c),
            "Invalid query: invalid point in URI param /coords/"
        );
    }
    assert_eq!(
        err("intersects", "point", "1,2;3,4"),
        "Invalid query: invalid number of coordinates for /point/"
    );
    assert_eq!(
        err("intersects", "line", "1,2;3,4;5.6"),
        "Invalid query: invalid point in URI param /coords/"
    );
    assert_eq!(
        err("intersects", "line", "1,2"),
        "Invalid query: invalid number of coordinates for /line/"
    );
    assert_eq!(
        err("intersects", "box", "1,2;3,4;5.6"),
        "Invalid query: invalid point in URI param /coords/"
    );
    assert_eq!(
        err("intersects", "box", "1,2"),
        "Invalid query: invalid number of coordinates for /box/"
    );
    assert_eq!(
        err("intersects", "polygon", "1,2;3,4"),
        "Invalid query: Too few coordinates for polygon"
    );
    for c in ["1,2;3,2", "1,2;1,8", "1,2;1,2"] {
        assert_eq!(
            err("coveredBy", "box", c),
            "Invalid query: box coordinates are not defining an actual box"
        );
    }
    // 1677 geoquery_points steps 06-07.
    assert_eq!(
        err("coveredBy", "point", "5,5"),
        "Invalid query: point geometry cannot be used with coveredBy georel"
    );
    assert_eq!(
        err("coveredBy", "line", "5,5;9,5"),
        "Invalid query: line geometry cannot be used with coveredBy georel"
    );
    // Invalid modifier (maxDistance=…).
    assert_eq!(
        err("near;maxDistance=1000", "point", "43.42015,-2.761160"),
        "Invalid query: Invalid modifier in georel parameter"
    );
    // 1306_string2double: non-numbers in coords.
    for c in ["B,5", "5,B"] {
        assert_eq!(
            err("near;maxDistance:10", "point", c),
            "Invalid query: invalid coordinates"
        );
    }
    for c in ["B,1.2;2.1,2.2;3.1,3.2", "1.1,B;2.1,2.2;3.1,3.2"] {
        let e = GeoQuery::from_ngsi_params(None, Some("polygon"), Some(c)).unwrap_err();
        assert_eq!(e.description(), "Invalid query: invalid coordinates");
    }
    assert_eq!(
        err("intersects", "point", "91,0"),
        "Invalid query: invalid coordinates"
    );
    assert_eq!(
        err("coveredBy;maxDistance:3", "box", "0,0;1,1"),
        "Invalid query: maxDistance erroneously used with georel /coveredBy/"
    );
    assert_eq!(
        err("near;maxDistance:x", "point", "0,0"),
        "Invalid query: invalid number for maxDistance"
    );
}

#[test]
fn parameter_presence() {
    // 1677 geo_location_for_api_v2_error_cases steps 01-03, 1177 steps 03-04.
    let e = |r, g, c| GeoQuery::from_params(r, g, c).unwrap_err().description();
    assert_eq!(
        e(None, Some("polygon"), None),
        "Invalid query: URI param /geometry/ used without /coords/"
    );
    assert_eq!(
        e(None, None, Some("1,2;3,4")),
        "Invalid query: URI param /coords/ used without /geometry/"
    );
    assert_eq!(
        e(Some("intersects"), None, None),
        "Invalid query: URI param /georel/ used without /geometry/"
    );
    assert_eq!(GeoQuery::from_params(None, None, None).unwrap(), None);
    let ok = GeoQuery::from_params(Some("near;maxDistance:5"), Some("point"), Some("1,2"))
        .unwrap()
        .unwrap();
    assert_eq!(
        ok.rel(),
        GeoRel::Near {
            min: None,
            max: Some(5.0)
        }
    );
    assert_eq!(*ok.geometry(), Geometry::Point(Position::new(2.0, 1.0)));
}

#[test]
fn parse_order_decides_the_error() {
    // Orion checks the relation against the geometry before reading the
    // coordinates, and closes no polygon itself.
    assert_eq!(
        err("near;maxDistance:10", "polygon", "B,1;2,2"),
        "Invalid query: georel /near/ used with geometry different than point"
    );
    assert_eq!(
        err("coveredBy", "line", "1,2"),
        "Invalid query: line geometry cannot be used with coveredBy georel"
    );
    assert_eq!(
        err("intersects", "polygon", "0,0;0,1;1,1;1,0"),
        "Invalid query: First and last point in polygon not the same"
    );
    assert_eq!(
        err("intersects", "polygon", "0,0;0,1;0,0"),
        "Invalid query: Too few coordinates for polygon"
    );
    assert_eq!(
        err("minDistance:5", "point", "0,0"),
        "Invalid query: minDistance erroneously used with georel //"
    );
    assert_eq!(
        err("near;near;maxDistance:1", "point", "0,0"),
        "Invalid query: georel type present more than once"
    );
    // Without georel, geometry and coords are checked, then ignored
    // (Orion); QuantumLeap's form wants a relation.
    assert_eq!(
        GeoQuery::from_ngsi_params(None, Some("point"), Some("1,2")).unwrap(),
        None
    );
    assert!(GeoQuery::from_ngsi_params(None, Some("point"), Some("x")).is_err());
    assert_eq!(
        GeoQuery::from_params(None, Some("point"), Some("1,2"))
            .unwrap_err()
            .description(),
        "Invalid query: georel without a relation"
    );
}

#[test]
fn expression_fields() {
    // op/query and subscriptions: all three or none, Orion's own prefix.
    let e = |r, g, c| {
        GeoQuery::from_expression(r, g, c)
            .unwrap_err()
            .description()
    };
    assert_eq!(
        e(Some("near;maxDistance:5"), Some("point"), None),
        "partial geo expression: geometry, georel and coords have to be provided together"
    );
    assert_eq!(
        e(None, Some("point"), Some("1,2")),
        "partial geo expression: geometry, georel and coords have to be provided together"
    );
    assert_eq!(
        e(Some("near;maxDistance:5"), Some("point"), Some("1,2;3,4")),
        "error parsing geo-query fields: invalid number of coordinates for /point/"
    );
    assert_eq!(GeoQuery::from_expression(None, None, None).unwrap(), None);
    assert!(
        GeoQuery::from_expression(Some("intersects"), Some("box"), Some("0,0;1,1"))
            .unwrap()
            .is_some()
    );
}

#[test]
fn edges_are_great_circles() {
    // The box lat 30..40, lon -10..10 has its northern edge on the great
    // circle through its corners, which bulges north of lat 40 at lon 0
    // (to lat 40.43). MongoDB (and so Orion) finds lat 40.1 inside.
    let north = pt(40.1, 0.0);
    assert!(q("coveredBy", "box", "30,-10;40,10").matches(&north));
    assert!(q("intersects", "box", "30,-10;40,10").matches(&north));
    assert!(!q("coveredBy", "box", "30,-10;40,10").matches(&pt(40.5, 0.0)));
    // A line across the antimeridian intersects another one crossing it.
    let dateline = Shape::from_attribute("geo:line", &json!(["0, 179", "0, -179"]))
        .unwrap()
        .unwrap();
    assert!(q("intersects", "line", "-1,180;1,180").matches(&dateline));
    assert!(q("disjoint", "line", "-1,0;1,0").matches(&dateline));
    // near a polygon: 0 inside, else to its nearest edge.
    let square = Shape::from_attribute("geo:box", &json!(["0, 0", "1, 1"]))
        .unwrap()
        .unwrap();
    assert_eq!(
        q("near;maxDistance:1", "point", "0.5,0.5").distance_m(&square),
        0.0
    );
    let d = q("near;maxDistance:1", "point", "0.5,2").distance_m(&square);
    assert!((d - 111_318.85).abs() < 20.0, "{d}");
}

#[test]
fn location_attribute_texts() {
    let e = |t: &str, v: serde_json::Value| Shape::from_attribute(t, &v).unwrap_err().description();
    let p = "error parsing location attribute: ";
    assert_eq!(
        e("geo:point", json!("40.41")),
        format!("{p}geo coordinates format error [see Orion user manual]: 40.41")
    );
    assert_eq!(
        e("geo:point", json!("91, 0")),
        format!("{p}geo coordinates format error [see Orion user manual]: 91, 0")
    );
    assert_eq!(
        e("geo:line", json!(["1, 2"])),
        format!("{p}geo:line uses at least 2 coordinates")
    );
    assert_eq!(
        e("geo:line", json!("1, 2")),
        format!("{p}geo:line, geo:box and geo:polygon needs array of strings as value")
    );
    assert_eq!(
        e("geo:box", json!(["1, 2", 3])),
        format!("{p}geo:line, geo:box and geo:polygon needs array of strings but some element is not a string")
    );
    assert_eq!(
        e("geo:box", json!(["1, 2", "3, 4", "5, 6"])),
        format!("{p}geo:box uses exactly 2 coordinates")
    );
    assert_eq!(
        e("geo:box", json!(["1, 2", "1, 4"])),
        format!("{p}geo:box coordinates are not defining an actual box")
    );
    assert_eq!(
        e("geo:polygon", json!(["0, 0", "0, 1", "1, 1"])),
        format!("{p}geo:polygon uses at least 4 coordinates")
    );
    assert_eq!(
        e("geo:polygon", json!(["0, 0", "0, 1", "1, 1", "1, 0"])),
        format!("{p}geo:polygon first and last coordinates must match")
    );
    assert_eq!(
        e("geo:polygon", json!(["0, 0", "0, 1", "x", "0, 0"])),
        format!("{p}geo coordinates format error [see Orion user manual]: x")
    );
    assert_eq!(
        e("geo:json", json!("5, 5")),
        "geo:json needs an object or null as value"
    );
    assert_eq!(
        Shape::from_attribute("geo:json", &json!(null)).unwrap(),
        None
    );
}

#[test]
fn features_and_collections() {
    let point = json!({"type": "Point", "coordinates": [-3.69, 40.41]});
    let feature = json!({"type": "Feature", "properties": {"name": "x"}, "geometry": point});
    let expected = Some(Shape::Point(Position::new(-3.69, 40.41)));
    assert_eq!(
        Shape::from_attribute("geo:json", &feature).unwrap(),
        expected
    );
    let one = json!({"type": "FeatureCollection", "features": [feature]});
    assert_eq!(Shape::from_attribute("geo:json", &one).unwrap(), expected);
    let e = |v: serde_json::Value| {
        Shape::from_attribute("geo:json", &v)
            .unwrap_err()
            .description()
    };
    let p = "error parsing location attribute: ";
    assert_eq!(
        e(json!({"type": "FeatureCollection", "features": [feature, feature]})),
        format!("{p}features in FeatureCollection has more than 1 item")
    );
    assert_eq!(
        e(json!({"type": "FeatureCollection", "features": []})),
        format!("{p}features in FeatureCollection has 0 items")
    );
    assert_eq!(
        e(json!({"type": "FeatureCollection", "features": {}})),
        format!("{p}features in FeatureCollection is not an array")
    );
    assert_eq!(
        e(json!({"type": "FeatureCollection"})),
        format!("{p}features field not found in FeatureCollection")
    );
    assert_eq!(
        e(json!({"type": "Feature", "properties": {}})),
        format!("{p}geometry in Feature not found")
    );
    assert_eq!(
        e(json!({"type": "Feature", "geometry": null})),
        format!("{p}geometry in Feature is not an object")
    );
    // A bad geometry inside a Feature is MongoDB's refusal.
    assert_eq!(
        e(json!({"type": "Feature", "geometry": {"type": "Point", "coordinates": [200, 0]}})),
        "Wrong GeoJson"
    );
}

#[test]
fn geometries_mongodb_refuses() {
    for bad in [
        json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}),
        json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0], [0, 0]]]}),
        // A bow tie: two edges cross.
        json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}),
        json!({"type": "Point", "coordinates": [0, 91]}),
        json!({"type": "Point", "coordinates": ["0", 1]}),
        json!({"type": "MultiPoint", "coordinates": [[0, 0], [0]]}),
        json!({"type": "GeometryCollection", "geometries": []}),
        json!({"type": "Point"}),
    ] {
        assert_eq!(
            Shape::from_attribute("geo:json", &bad).unwrap_err(),
            LocationError::WrongGeoJson,
            "{bad}"
        );
    }
}

#[test]
fn stored_locations_are_read_without_rechecking() {
    let square =
        json!({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]});
    assert_eq!(
        Shape::of_stored_attribute("geo:json", &square),
        Shape::from_attribute("geo:json", &square).unwrap()
    );
    assert_eq!(Shape::of_stored_attribute("geo:point", &json!(null)), None);
    assert_eq!(Shape::of_stored_attribute("Text", &json!("1, 2")), None);
    assert_eq!(Shape::of_stored_attribute("geo:point", &json!("x")), None);
}

#[test]
fn short_edges_keep_a_tight_tolerance() {
    // A 1.1 m edge along the equator; a point 1.1 cm north of its middle
    // is off it, a point on it is on it.
    let edge = Shape::from_attribute("geo:line", &json!(["0, 0", "0, 0.00001"]))
        .unwrap()
        .unwrap();
    assert!(q("intersects", "point", "0,0.000005").matches(&edge));
    assert!(!q("intersects", "point", "0.0000001,0.000005").matches(&edge));
}

#[test]
fn empty_pieces_as_orion_splits_them() {
    // Leading delimiters are skipped, the others make empty pieces.
    assert!(GeoQuery::parse(";near;maxDistance:10", ";point", ";1,2").is_ok());
    assert_eq!(
        err("near;maxDistance:10;", "point", "1,2"),
        "Invalid query: Invalid modifier in georel parameter"
    );
    assert_eq!(
        err("near;maxDistance:10", "point;", "1,2"),
        "Invalid query: error parsing geometry: Invalid selector in geometry specification"
    );
    assert_eq!(
        err("near;maxDistance:10", "point", "1,2;"),
        "Invalid query: invalid point in URI param /coords/"
    );
    assert_eq!(err(";", "point", "1,2"), "Invalid query: empty georel");
    assert_eq!(
        err("near;maxDistance:10", "point", ";"),
        "Invalid query: erroneous coordinates for geometry"
    );
}

#[test]
fn negative_distances_bound_nothing() {
    // Orion hands only non-negative bounds to MongoDB.
    let far = pt(50.0, 50.0);
    assert!(q("near;maxDistance:-1", "point", "0,0").matches(&far));
    assert!(q("near;minDistance:-5;maxDistance:10", "point", "50,50").matches(&far));
}
