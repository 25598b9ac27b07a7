//! librbd's and librados's C API, generated from librbd-dev's headers by
//! build.rs.

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/librbd.rs"));
