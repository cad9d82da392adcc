//! Geometry on the sphere, the way MongoDB's `2dsphere` index (and so
//! Orion) sees it: positions are points on a sphere, an edge between two
//! positions is the shorter great-circle arc between them (not a straight
//! line in longitude/latitude), and a polygon is the smaller of the two
//! regions its ring divides the sphere into. Distances are great-circle
//! distances on a sphere of radius [`EARTH_RADIUS_M`].
//!
//! The predicates work on unit vectors with exact-sign tests in the style
//! of the S2 library MongoDB uses: two arcs cross when each one's ends lie
//! on opposite sides of the other's great circle; a point is inside a ring
//! when the ring winds once around it. Boundaries count as inside
//! (Orion's `coveredBy` is "border inclusive").

use super::Position;

/// The Earth radius MongoDB's geo queries use, in meters
/// (`kRadiusOfEarthInMeters`): `near` distances are measured with it, so
/// a `maxDistance` boundary falls where Orion's does.
pub const EARTH_RADIUS_M: f64 = 6_378_100.0;

/// Tolerance of the geometric tests, in radians (about 6 micrometers on
/// the Earth): a point that close to a great circle is on it. Coordinates
/// given in decimal degrees land exactly on the edges they name
/// (`5,5;9,5` and the point `7,5`) despite rounding.
const EPS: f64 = 1e-12;

/// A point of the unit sphere in Earth-centred coordinates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Vec3 {
    x: f64,
    y: f64,
    z: f64,
}

impl Vec3 {
    fn dot(self, o: Vec3) -> f64 {
        self.x * o.x + self.y * o.y + self.z * o.z
    }

    fn cross(self, o: Vec3) -> Vec3 {
        Vec3 {
            x: self.y * o.z - self.z * o.y,
            y: self.z * o.x - self.x * o.z,
            z: self.x * o.y - self.y * o.x,
        }
    }

    fn add(self, o: Vec3) -> Vec3 {
        Vec3 {
            x: self.x + o.x,
            y: self.y + o.y,
            z: self.z + o.z,
        }
    }

    fn norm(self) -> f64 {
        self.dot(self).sqrt()
    }
}

impl From<Position> for Vec3 {
    fn from(p: Position) -> Vec3 {
        let (lat, lon) = (p.lat.to_radians(), p.lon.to_radians());
        Vec3 {
            x: lat.cos() * lon.cos(),
            y: lat.cos() * lon.sin(),
            z: lat.sin(),
        }
    }
}

/// The angle between two unit vectors, in radians (0..=π); `atan2` keeps
/// it exact for tiny and for near-antipodal angles alike.
fn angle(a: Vec3, b: Vec3) -> f64 {
    a.cross(b).norm().atan2(a.dot(b))
}

/// Great-circle distance between two positions, in meters.
pub fn distance_m(a: Position, b: Position) -> f64 {
    angle(a.into(), b.into()) * EARTH_RADIUS_M
}

/// Which side of the great circle through `a` then `b` the point `c` is
/// on: +1 left, -1 right, 0 on it (or `a` and `b` name no circle).
fn side(a: Vec3, b: Vec3, c: Vec3) -> i8 {
    let n = a.cross(b);
    let len = n.norm();
    if len == 0.0 {
        return 0;
    }
    // The sine of the angle from the circle's plane: a distance.
    let d = n.dot(c) / len;
    if d > EPS {
        1
    } else if d < -EPS {
        -1
    } else {
        0
    }
}

/// Whether `p` lies on the arc from `a` to `b`, ends included.
fn on_arc(a: Vec3, b: Vec3, p: Vec3) -> bool {
    if a == b || a.cross(b).norm() <= EPS {
        return p.cross(a).norm() <= EPS && p.dot(a) > 0.0;
    }
    let n = a.cross(b);
    side(a, b, p) == 0
        && a.cross(p).dot(n) >= -EPS
        && p.cross(b).dot(n) >= -EPS
        && p.dot(a.add(b)) > 0.0
}

/// Whether the arcs `ab` and `cd` cross at a point inside both (S2's
/// `CrossingSign` > 0): the four orientations ACB, BDA, CBD, DAC agree.
fn arcs_cross(a: Vec3, b: Vec3, c: Vec3, d: Vec3) -> bool {
    let acb = -side(a, b, c);
    if acb == 0 || side(a, b, d) != acb {
        return false;
    }
    -side(c, d, b) == acb && side(c, d, a) == acb
}

/// Whether the arcs `ab` and `cd` share at least one point.
fn arcs_meet(a: Vec3, b: Vec3, c: Vec3, d: Vec3) -> bool {
    arcs_cross(a, b, c, d)
        || on_arc(c, d, a)
        || on_arc(c, d, b)
        || on_arc(a, b, c)
        || on_arc(a, b, d)
}

/// Shortest angle from `p` to the arc `ab`.
fn angle_to_arc(p: Vec3, a: Vec3, b: Vec3) -> f64 {
    let n = a.cross(b);
    let len = n.norm();
    if len > EPS && a.cross(p).dot(n) > 0.0 && p.cross(b).dot(n) > 0.0 {
        // The foot of the perpendicular from p lies on the arc.
        return (p.dot(n) / len).abs().min(1.0).asin();
    }
    angle(p, a).min(angle(p, b))
}

/// A closed ring (first vertex repeated last) as unit vectors, with the
/// centre of its vertices, which tells its inside (the smaller region)
/// from its outside.
#[derive(Debug, Clone)]
pub(crate) struct Ring {
    vertices: Vec<Vec3>,
    centre: Vec3,
}

impl Ring {
    /// The ring through `ring`'s positions (closed: first == last).
    pub(crate) fn new(ring: &[Position]) -> Ring {
        let vertices: Vec<Vec3> = ring.iter().map(|&p| p.into()).collect();
        let centre = vertices.iter().skip(1).fold(
            Vec3 {
                x: 0.0,
                y: 0.0,
                z: 0.0,
            },
            |acc, &v| acc.add(v),
        );
        Ring { vertices, centre }
    }

    fn edges(&self) -> impl Iterator<Item = (Vec3, Vec3)> + '_ {
        self.vertices.windows(2).map(|w| (w[0], w[1]))
    }

    fn on_boundary(&self, p: Vec3) -> bool {
        self.edges().any(|(a, b)| on_arc(a, b, p))
    }

    /// Inside or on the ring. The ring winds once around the points of its
    /// inside (the sum of the angles its edges subtend at the point is
    /// ±2π) and not at all around the points outside; the hemisphere test
    /// keeps the far side of the sphere, which a ring also "winds around",
    /// outside.
    fn contains(&self, p: Vec3) -> bool {
        if self.on_boundary(p) {
            return true;
        }
        if p.dot(self.centre) <= 0.0 {
            return false;
        }
        let winding: f64 = self
            .edges()
            .map(|(a, b)| {
                let sin = p.dot(a.cross(b));
                let cos = a.dot(b) - p.dot(a) * p.dot(b);
                sin.atan2(cos)
            })
            .sum();
        winding.abs() > std::f64::consts::PI
    }

    /// Whether two edges of the ring cross each other (a self-intersecting
    /// loop, which MongoDB refuses to index).
    pub(crate) fn self_crossing(&self) -> bool {
        let edges: Vec<(Vec3, Vec3)> = self.edges().collect();
        let n = edges.len();
        (0..n).any(|i| {
            ((i + 2)..n).any(|j| {
                // The first and last edges share the closing vertex.
                !(i == 0 && j == n - 1) && {
                    let ((a, b), (c, d)) = (edges[i], edges[j]);
                    arcs_cross(a, b, c, d)
                }
            })
        })
    }
}

/// A geometry broken into what the relations look at: loose points,
/// edges (of lines and of polygon rings), and polygons (outer ring, then
/// holes).
#[derive(Debug, Clone, Default)]
pub(crate) struct Parts {
    points: Vec<Vec3>,
    edges: Vec<(Vec3, Vec3)>,
    polygons: Vec<Vec<Ring>>,
}

impl Parts {
    /// Adds a loose point (a Point, a member of a MultiPoint).
    pub(crate) fn add_point(&mut self, p: Position) {
        self.points.push(p.into());
    }

    /// Adds the edges of a line (or of a ring).
    pub(crate) fn add_line(&mut self, line: &[Position]) {
        let vs: Vec<Vec3> = line.iter().map(|&p| p.into()).collect();
        if vs.len() == 1 {
            self.points.push(vs[0]);
        }
        self.edges.extend(vs.windows(2).map(|w| (w[0], w[1])));
    }

    /// Adds a polygon: its rings' edges, and its area.
    pub(crate) fn add_polygon(&mut self, rings: &[Vec<Position>]) {
        for r in rings {
            self.add_line(r);
        }
        self.polygons
            .push(rings.iter().map(|r| Ring::new(r)).collect());
    }

    /// Every position: loose points and the ends of every edge.
    fn vertices(&self) -> impl Iterator<Item = Vec3> + '_ {
        self.points
            .iter()
            .copied()
            .chain(self.edges.iter().flat_map(|&(a, b)| [a, b]))
    }

    /// Whether `p` is one of the points, on an edge, or inside a polygon
    /// (and not strictly inside one of its holes).
    fn contains(&self, p: Vec3) -> bool {
        self.points
            .iter()
            .any(|&q| p.cross(q).norm() <= EPS && p.dot(q) > 0.0)
            || self.edges.iter().any(|&(a, b)| on_arc(a, b, p))
            || self.polygons.iter().any(|rings| in_polygon(rings, p))
    }

    /// Whether the two geometries share at least one point.
    pub(crate) fn intersects(&self, other: &Parts) -> bool {
        self.vertices().any(|p| other.contains(p))
            || other.vertices().any(|p| self.contains(p))
            || self
                .edges
                .iter()
                .any(|&(a, b)| other.edges.iter().any(|&(c, d)| arcs_meet(a, b, c, d)))
    }

    /// Whether every point of this geometry lies inside or on `region`
    /// (a polygon without holes): every vertex is, and no edge leaves it.
    pub(crate) fn covered_by(&self, region: &Ring) -> bool {
        let mut vertices = self.vertices().peekable();
        vertices.peek().is_some()
            && self.vertices().all(|p| region.contains(p))
            && self
                .edges
                .iter()
                .all(|&(a, b)| region.edges().all(|(c, d)| !arcs_cross(a, b, c, d)))
    }

    /// Distance in meters from `p` to the nearest point of the geometry:
    /// 0 inside a polygon, else to the nearest point, edge or vertex.
    pub(crate) fn distance_m(&self, p: Position) -> f64 {
        let p: Vec3 = p.into();
        if self.polygons.iter().any(|rings| in_polygon(rings, p)) {
            return 0.0;
        }
        let to_points = self.points.iter().map(|&q| angle(p, q));
        let to_edges = self.edges.iter().map(|&(a, b)| angle_to_arc(p, a, b));
        to_points.chain(to_edges).fold(f64::INFINITY, f64::min) * EARTH_RADIUS_M
    }
}

/// Inside the outer ring (boundary included) and not strictly inside a hole.
fn in_polygon(rings: &[Ring], p: Vec3) -> bool {
    let Some((outer, holes)) = rings.split_first() else {
        return false;
    };
    outer.contains(p) && holes.iter().all(|h| h.on_boundary(p) || !h.contains(p))
}
