//! weft bench (placeholder)
