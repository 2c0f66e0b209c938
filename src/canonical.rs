//! canonical
