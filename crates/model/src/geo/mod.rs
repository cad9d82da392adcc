//! Geometry for geo-queries (being written).
