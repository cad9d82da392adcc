//! Bridges: publish platform events into channels (work in progress).
