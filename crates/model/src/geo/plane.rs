//! The relations of geo-queries on the plane of longitude and latitude,
//! as PostGIS computes them on `geometry` values — what QuantumLeap's
//! history queries answer (`ST_Intersects`, `ST_CoveredBy`,
//! `ST_Disjoint`). Edges are straight in degrees, not great circles: a
//! point halfway between two coordinates lies on the line between them,
//! and a line can be covered by another line or a point by a point.
//!
//! Orion's queries use [`super::sphere`] instead, as MongoDB does.

use super::{Position, Shape};

/// Coordinates closer than this (in degrees) are one point: well below
/// the precision of stored coordinates, well above `f64` rounding.
const EPS: f64 = 1e-9;

/// A point of the plane: (longitude, latitude).
type P = (f64, f64);

/// A shape broken into loose points, straight segments and polygons
/// (outer ring, then holes).
#[derive(Debug, Default)]
struct Flat {
    points: Vec<P>,
    segments: Vec<(P, P)>,
    polygons: Vec<Vec<Vec<P>>>,
}

impl Flat {
    fn of(shape: &Shape) -> Flat {
        let p = |q: &Position| (q.lon, q.lat);
        let mut flat = Flat::default();
        let line = |flat: &mut Flat, l: &[Position]| {
            if l.len() == 1 {
                flat.points.push(p(&l[0]));
            }
            flat.segments
                .extend(l.windows(2).map(|w| (p(&w[0]), p(&w[1]))));
        };
        let polygon = |flat: &mut Flat, rings: &[Vec<Position>]| {
            for r in rings {
                line(flat, r);
            }
            flat.polygons
                .push(rings.iter().map(|r| r.iter().map(p).collect()).collect());
        };
        match shape {
            Shape::Point(q) => flat.points.push(p(q)),
            Shape::MultiPoint(qs) => flat.points.extend(qs.iter().map(p)),
            Shape::LineString(l) => line(&mut flat, l),
            Shape::MultiLineString(ls) => ls.iter().for_each(|l| line(&mut flat, l)),
            Shape::Polygon(rings) => polygon(&mut flat, rings),
            Shape::MultiPolygon(ps) => ps.iter().for_each(|rings| polygon(&mut flat, rings)),
        }
        flat
    }

    /// Every position: loose points and segment ends.
    fn vertices(&self) -> impl Iterator<Item = P> + '_ {
        self.points
            .iter()
            .copied()
            .chain(self.segments.iter().flat_map(|&(a, b)| [a, b]))
    }

    /// Whether `p` is one of the points, on a segment, or in a polygon's
    /// area (boundary included, holes' insides excluded).
    fn contains(&self, p: P) -> bool {
        self.points.iter().any(|&q| same(p, q))
            || self.segments.iter().any(|&(a, b)| on_segment(p, a, b))
            || self.polygons.iter().any(|rings| in_polygon(rings, p))
    }

    /// Whether `p` is strictly inside a polygon's area (not on any ring).
    fn strictly_inside(&self, p: P) -> bool {
        !self.segments.iter().any(|&(a, b)| on_segment(p, a, b))
            && self.polygons.iter().any(|rings| in_polygon(rings, p))
    }
}

/// Whether the two shapes share at least one point (`ST_Intersects`).
pub(crate) fn intersects(a: &Shape, b: &Shape) -> bool {
    let (a, b) = (Flat::of(a), Flat::of(b));
    a.vertices().any(|p| b.contains(p))
        || b.vertices().any(|p| a.contains(p))
        || a.segments
            .iter()
            .any(|&(p, q)| b.segments.iter().any(|&(r, s)| segments_meet(p, q, r, s)))
}

/// Whether every point of `a` lies in `region` (`ST_CoveredBy`): its
/// points, and each of its segments cut where `region`'s boundary meets
/// it, at both ends and the middle of every piece; a region with holes
/// also must not have one inside `a`.
pub(crate) fn covered_by(a: &Shape, region: &Shape) -> bool {
    let (a, region) = (Flat::of(a), Flat::of(region));
    let mut any = false;
    for p in a.vertices() {
        any = true;
        if !region.contains(p) {
            return false;
        }
    }
    for &(p, q) in &a.segments {
        // Where the region's edges and vertices touch the segment, as
        // fractions along it.
        let mut cuts = vec![0.0, 1.0];
        for &(r, s) in &region.segments {
            if let Some(t) = crossing(p, q, r, s) {
                cuts.push(t);
            }
            for v in [r, s] {
                if on_segment(v, p, q) {
                    cuts.push(fraction(p, q, v));
                }
            }
        }
        cuts.sort_by(f64::total_cmp);
        let covered = cuts.windows(2).all(|w| {
            let t = (w[0] + w[1]) / 2.0;
            region.contains((p.0 + (q.0 - p.0) * t, p.1 + (q.1 - p.1) * t))
        });
        if !covered {
            return false;
        }
    }
    // A hole of the region strictly inside `a`'s area leaves part of `a`
    // uncovered though its boundary is.
    let holes_inside = region
        .polygons
        .iter()
        .flat_map(|rings| rings.iter().skip(1).flatten())
        .any(|&v| a.strictly_inside(v));
    any && !holes_inside
}

fn same(p: P, q: P) -> bool {
    (p.0 - q.0).abs() <= EPS && (p.1 - q.1).abs() <= EPS
}

/// The cross product of (b - a) and (c - a): zero when collinear.
fn cross(a: P, b: P, c: P) -> f64 {
    (b.0 - a.0) * (c.1 - a.1) - (b.1 - a.1) * (c.0 - a.0)
}

/// Whether `p` lies on the segment from `a` to `b` (ends included).
fn on_segment(p: P, a: P, b: P) -> bool {
    let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
    if len <= EPS {
        return same(p, a);
    }
    (cross(a, b, p) / len).abs() <= EPS
        && p.0 >= a.0.min(b.0) - EPS
        && p.0 <= a.0.max(b.0) + EPS
        && p.1 >= a.1.min(b.1) - EPS
        && p.1 <= a.1.max(b.1) + EPS
}

/// How far along the segment from `a` to `b` the point `p` on it is (0 to 1).
fn fraction(a: P, b: P, p: P) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    if len2 == 0.0 {
        return 0.0;
    }
    (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0)
}

/// Where the segment `p`–`q` properly crosses `r`–`s`, as a fraction
/// along `p`–`q`; `None` when they are parallel or miss.
fn crossing(p: P, q: P, r: P, s: P) -> Option<f64> {
    let d = (q.0 - p.0) * (s.1 - r.1) - (q.1 - p.1) * (s.0 - r.0);
    if d.abs() <= f64::EPSILON {
        return None;
    }
    let t = ((r.0 - p.0) * (s.1 - r.1) - (r.1 - p.1) * (s.0 - r.0)) / d;
    let u = ((r.0 - p.0) * (q.1 - p.1) - (r.1 - p.1) * (q.0 - p.0)) / d;
    ((0.0..=1.0).contains(&t) && (0.0..=1.0).contains(&u)).then_some(t)
}

/// Whether two segments share a point (crossing, touching or overlapping).
fn segments_meet(p: P, q: P, r: P, s: P) -> bool {
    crossing(p, q, r, s).is_some()
        || on_segment(p, r, s)
        || on_segment(q, r, s)
        || on_segment(r, p, q)
        || on_segment(s, p, q)
}

/// Inside the outer ring (boundary included) and not strictly inside a
/// hole.
fn in_polygon(rings: &[Vec<P>], p: P) -> bool {
    let Some((outer, holes)) = rings.split_first() else {
        return false;
    };
    let on = |ring: &[P]| ring.windows(2).any(|w| on_segment(p, w[0], w[1]));
    (on(outer) || inside_ring(outer, p)) && holes.iter().all(|h| on(h) || !inside_ring(h, p))
}

/// Even-odd ray casting (the boundary is the caller's concern).
fn inside_ring(ring: &[P], p: P) -> bool {
    let mut inside = false;
    for w in ring.windows(2) {
        let (a, b) = (w[0], w[1]);
        if (a.1 > p.1) != (b.1 > p.1) {
            let x = a.0 + (p.1 - a.1) * (b.0 - a.0) / (b.1 - a.1);
            if p.0 < x {
                inside = !inside;
            }
        }
    }
    inside
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(lon: f64, lat: f64) -> Shape {
        Shape::Point(Position::new(lon, lat))
    }

    fn line(ps: &[(f64, f64)]) -> Shape {
        Shape::LineString(ps.iter().map(|&(x, y)| Position::new(x, y)).collect())
    }

    #[test]
    fn a_point_halfway_along_a_straight_line_is_on_it() {
        let diagonal = line(&[(0.0, 0.0), (2.0, 2.0)]);
        assert!(intersects(&pt(1.0, 1.0), &diagonal));
        assert!(covered_by(&pt(1.0, 1.0), &diagonal));
        assert!(!intersects(&pt(1.0, 1.5), &diagonal));
        // Along a parallel: straight in degrees, not a great circle.
        assert!(intersects(&pt(1.0, 1.0), &line(&[(0.0, 1.0), (2.0, 1.0)])));
    }

    #[test]
    fn lines_cover_lines_they_contain() {
        let long = line(&[(0.0, 1.0), (2.0, 1.0)]);
        assert!(covered_by(&line(&[(0.5, 1.0), (1.5, 1.0)]), &long));
        assert!(covered_by(&long, &long));
        assert!(!covered_by(&line(&[(0.5, 1.0), (2.5, 1.0)]), &long));
        assert!(!covered_by(&line(&[(0.5, 1.0), (1.5, 1.2)]), &long));
        // Covered by two lines together.
        let two = Shape::MultiLineString(vec![
            vec![Position::new(0.0, 0.0), Position::new(1.0, 0.0)],
            vec![Position::new(1.0, 0.0), Position::new(2.0, 0.0)],
        ]);
        assert!(covered_by(&line(&[(0.5, 0.0), (1.5, 0.0)]), &two));
    }

    #[test]
    fn polygons_cover_what_lies_inside_or_on_them() {
        let region = Shape::square(0.0, 0.0, 3.0, 3.0);
        assert!(covered_by(&pt(3.0, 1.0), &region), "boundary included");
        assert!(covered_by(&Shape::square(0.5, 0.5, 1.5, 1.5), &region));
        assert!(covered_by(&line(&[(0.0, 0.0), (3.0, 3.0)]), &region));
        assert!(!covered_by(&line(&[(1.0, 1.0), (4.0, 1.0)]), &region));
        assert!(!covered_by(&pt(3.5, 1.0), &region));
        // A concave region: both ends inside, the middle outside.
        let u = Shape::Polygon(vec![[
            (0.0, 0.0),
            (3.0, 0.0),
            (3.0, 3.0),
            (2.0, 3.0),
            (2.0, 1.0),
            (1.0, 1.0),
            (1.0, 3.0),
            (0.0, 3.0),
            (0.0, 0.0),
        ]
        .iter()
        .map(|&(x, y)| Position::new(x, y))
        .collect()]);
        assert!(!covered_by(&line(&[(0.5, 2.0), (2.5, 2.0)]), &u));
        assert!(covered_by(&line(&[(0.5, 0.5), (2.5, 0.5)]), &u));
        // A hole inside the shape.
        let holed = Shape::Polygon(vec![
            match Shape::square(0.0, 0.0, 3.0, 3.0) {
                Shape::Polygon(mut r) => r.remove(0),
                _ => unreachable!(),
            },
            match Shape::square(1.0, 1.0, 2.0, 2.0) {
                Shape::Polygon(mut r) => r.remove(0),
                _ => unreachable!(),
            },
        ]);
        assert!(!covered_by(&Shape::square(0.5, 0.5, 2.5, 2.5), &holed));
        assert!(covered_by(&Shape::square(0.1, 0.1, 0.9, 0.9), &holed));
    }

    #[test]
    fn points_cover_only_themselves() {
        assert!(covered_by(&pt(1.0, 1.0), &pt(1.0, 1.0)));
        assert!(!covered_by(&pt(1.0, 1.0), &pt(1.0, 2.0)));
        assert!(!covered_by(&line(&[(1.0, 1.0), (1.0, 2.0)]), &pt(1.0, 1.0)));
    }

    #[test]
    fn shapes_intersect_by_crossing_touching_or_containing() {
        let region = Shape::square(0.5, 0.5, 1.5, 1.5);
        assert!(
            intersects(&line(&[(0.0, 1.0), (2.0, 1.0)]), &region),
            "crossing"
        );
        assert!(intersects(&pt(1.0, 1.0), &region), "inside");
        assert!(
            intersects(&Shape::square(0.9, 0.9, 1.1, 1.1), &region),
            "contained"
        );
        assert!(
            intersects(&region, &Shape::square(0.9, 0.9, 1.1, 1.1)),
            "containing"
        );
        assert!(
            intersects(&Shape::square(1.5, 0.0, 2.0, 0.5), &region),
            "touching at a corner"
        );
        assert!(!intersects(&pt(10.0, 10.0), &region));
        assert!(
            intersects(
                &line(&[(0.5, 0.5), (1.5, 1.5)]),
                &line(&[(0.0, 0.0), (2.0, 2.0)])
            ),
            "overlapping"
        );
    }
}
