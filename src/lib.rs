//! Root package of the kvd workspace: it owns `tests/` and `benches/`; the code lives in `crates/`.
