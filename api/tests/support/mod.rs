//! Helpers every API test binary shares.

// Not every binary uses every helper.
#![allow(dead_code)]

pub mod contract;
