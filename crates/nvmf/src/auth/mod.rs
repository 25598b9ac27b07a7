//! In-band authentication with DH-HMAC-CHAP (Base 2.0, 8.13): the
//! secrets hosts and controllers prove they know.

mod key;

pub use key::{read_secret, Hash, Secret};
