//! streamd
