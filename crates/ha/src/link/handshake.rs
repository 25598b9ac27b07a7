//! Mutual authentication of the two nodes over a shared secret.
//!
//! ```text
//! dialer   → HELLO     version, dialer name, dialer nonce
//! listener → CHALLENGE version, listener name, listener nonce
//! dialer   → PROOF     HMAC(secret, "dialer", both nonces, both names)
//! listener → WELCOME   HMAC(secret, "listener", both nonces, both names)
//! ```
//!
//! The listener, the side anyone can reach, proves nothing until the
//! dialer has: a stranger learns no value computed from the secret. Both
//! proofs cover both fresh nonces, so neither can be replayed, and a
//! label per direction, so one side's proof cannot be reflected back as
//! the other's. Until WELCOME nothing but these frames is read or sent.

use std::io;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::wire::{self, put_str, read_frame, Reader};

pub const VERSION: u16 = 1;
/// Handshake frames are small; a peer that is not yet known may not make
/// the listener hold more.
pub const MAX_HANDSHAKE_FRAME: usize = 512;
pub const MAX_NAME: usize = 64;

const HELLO: u8 = 1;
const CHALLENGE: u8 = 2;
const PROOF: u8 = 3;
const WELCOME: u8 = 4;

type Nonce = [u8; 32];

fn nonce() -> Nonce {
    let mut n = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

fn keyed(
    secret: &[u8],
    label: &str,
    nonces: (&Nonce, &Nonce),
    names: (&str, &str),
) -> Hmac<Sha256> {
    // Any key length is accepted by HMAC.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
    for part in [
        label.as_bytes(),
        &nonces.0[..],
        &nonces.1[..],
        names.0.as_bytes(),
        names.1.as_bytes(),
    ] {
        mac.update(&(part.len() as u16).to_le_bytes());
        mac.update(part);
    }
    mac
}

/// The proof of one side: `label` is "dialer" or "listener"; nonces and
/// names are always in the order dialer, listener.
pub fn proof(
    secret: &[u8],
    label: &str,
    nonces: (&Nonce, &Nonce),
    names: (&str, &str),
) -> [u8; 32] {
    keyed(secret, label, nonces, names)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `mac` is that proof, compared in constant time.
fn verify(
    mac: &[u8],
    secret: &[u8],
    label: &str,
    nonces: (&Nonce, &Nonce),
    names: (&str, &str),
) -> bool {
    keyed(secret, label, nonces, names)
        .verify_slice(mac)
        .is_ok()
}

fn hello(kind: u8, name: &str, nonce: &Nonce) -> Vec<u8> {
    let mut b = VERSION.to_le_bytes().to_vec();
    put_str(&mut b, name);
    b.extend_from_slice(nonce);
    wire::encode(kind, &b)
}

fn refused(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.into())
}

async fn read_hello<R: AsyncRead + Unpin>(r: &mut R, kind: u8) -> io::Result<(String, Nonce)> {
    let f = read_frame(r, MAX_HANDSHAKE_FRAME).await?;
    if f.kind != kind {
        return Err(wire::malformed(format!(
            "handshake frame {} where {kind} was due",
            f.kind
        )));
    }
    let mut p = Reader::new(&f.payload);
    let version = p.u16()?;
    let name = p.str()?.to_string();
    let nonce = p.array::<32>()?;
    p.end()?;
    if version != VERSION {
        return Err(refused(format!(
            "link protocol version {version} (this node speaks {VERSION})"
        )));
    }
    if name.len() > MAX_NAME {
        return Err(wire::malformed("a node name over 64 bytes"));
    }
    Ok((name, nonce))
}

async fn read_mac<R: AsyncRead + Unpin>(r: &mut R, kind: u8) -> io::Result<[u8; 32]> {
    let f = read_frame(r, MAX_HANDSHAKE_FRAME).await?;
    if f.kind != kind {
        return Err(wire::malformed(format!(
            "handshake frame {} where {kind} was due",
            f.kind
        )));
    }
    let mut p = Reader::new(&f.payload);
    let mac = p.array::<32>()?;
    p.end()?;
    Ok(mac)
}

/// The dialer's side: returns once both sides proved the secret.
pub async fn dial<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    me: &str,
    peer: &str,
    secret: &[u8],
) -> io::Result<()> {
    let mine = nonce();
    s.write_all(&hello(HELLO, me, &mine)).await?;
    let (name, theirs) = read_hello(s, CHALLENGE).await?;
    if name != peer {
        return Err(refused(format!(
            "the node at the peer's address is {name:?}, not {peer:?}"
        )));
    }
    let nonces = (&mine, &theirs);
    let names = (me, peer);
    s.write_all(&wire::encode(
        PROOF,
        &proof(secret, "dialer", nonces, names),
    ))
    .await?;
    let mac = read_mac(s, WELCOME).await.map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            refused(format!("{peer} refused this node's proof of the secret"))
        }
        _ => e,
    })?;
    if !verify(&mac, secret, "listener", nonces, names) {
        return Err(refused(format!("{peer} failed to prove the shared secret")));
    }
    Ok(())
}

/// What the listener learnt of a dialer before checking its proof.
pub struct Claim {
    pub name: String,
    nonces: (Nonce, Nonce),
    mac: [u8; 32],
}

/// The listener's side up to the dialer's proof, which [`Claim::check`]
/// checks (after any back-off the caller imposes).
pub async fn listen<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, me: &str) -> io::Result<Claim> {
    let (name, theirs) = read_hello(s, HELLO).await?;
    let mine = nonce();
    s.write_all(&hello(CHALLENGE, me, &mine)).await?;
    let mac = read_mac(s, PROOF).await?;
    Ok(Claim {
        name,
        nonces: (theirs, mine),
        mac,
    })
}

impl Claim {
    /// Whether the dialer proved the secret as `peer`; if so, sends the
    /// listener's own proof.
    pub async fn check<S: AsyncWrite + Unpin>(
        &self,
        s: &mut S,
        me: &str,
        peer: &str,
        secret: &[u8],
    ) -> io::Result<bool> {
        let nonces = (&self.nonces.0, &self.nonces.1);
        let names = (self.name.as_str(), me);
        if self.name != peer || !verify(&self.mac, secret, "dialer", nonces, names) {
            return Ok(false);
        }
        s.write_all(&wire::encode(
            WELCOME,
            &proof(secret, "listener", nonces, names),
        ))
        .await?;
        Ok(true)
    }
}

/// How long a whole handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(
        dialer_secret: &'static [u8],
        listener_secret: &'static [u8],
    ) -> (io::Result<()>, bool) {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let dialer = tokio::spawn(async move { dial(&mut a, "a", "b", dialer_secret).await });
        let claim = listen(&mut b, "b").await.unwrap();
        let ok = claim
            .check(&mut b, "b", "a", listener_secret)
            .await
            .unwrap();
        drop(b);
        (dialer.await.unwrap(), ok)
    }

    #[tokio::test]
    async fn the_same_secret_passes_both_ways_and_a_wrong_one_neither() {
        let (d, l) = pair(b"0123456789abcdef", b"0123456789abcdef").await;
        assert!(d.is_ok() && l);
        let (d, l) = pair(b"0123456789abcdef", b"0123456789abcdeX").await;
        assert!(!l);
        assert_eq!(d.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn proofs_are_bound_to_direction_nonces_and_names() {
        let (n1, n2) = ([1u8; 32], [2u8; 32]);
        let p = proof(b"s", "dialer", (&n1, &n2), ("a", "b"));
        assert!(verify(&p, b"s", "dialer", (&n1, &n2), ("a", "b")));
        assert!(!verify(&p, b"s", "listener", (&n1, &n2), ("a", "b")));
        assert!(!verify(&p, b"s", "dialer", (&n2, &n1), ("a", "b")));
        assert!(!verify(&p, b"s", "dialer", (&n1, &n2), ("b", "a")));
        // Length prefixes: moving a byte between fields changes the proof.
        assert!(!verify(&p, b"s", "dialer", (&n1, &n2), ("ab", "")));
    }
}
