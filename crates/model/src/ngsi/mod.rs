//! NGSIv2 context entities (being written).
