//! tso
