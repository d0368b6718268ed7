//! Synthetic graph traces (being written: see issue 2).
