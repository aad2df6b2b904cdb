//! The obviously-correct reference backend of dsv4 (plain loops, f64 accumulation).
