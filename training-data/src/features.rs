//! Step featurizer (being written: see issue 2 / 4).
