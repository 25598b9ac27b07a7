//! A secondary takes writes only from a primary whose generation it
//! agreed to: a connection that proved the secret but claims a stale
//! generation, or none, is refused.

mod common;

use block::BlockDevice;
use common::pair::{options, pattern, primary_a, NAME};
use common::SECRET;
use ha::link::handshake;
use ha::mirror::generations::Generations;
use ha::mirror::wire::{Request, State};
use ha::wire::{encode, put_str, read_frame};
use ha::{Connection, Role};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

struct Raw {
    s: TcpStream,
    next: u64,
}

impl Raw {
    async fn notice(&mut self, state: &State) {
        let mut p = Vec::new();
        put_str(&mut p, NAME);
        p.extend_from_slice(&state.encode());
        self.s.write_all(&encode(22, &p)).await.unwrap();
    }

    /// The reply's status byte: 0 done, 1 refused.
    async fn request(&mut self, body: &[u8]) -> u8 {
        self.next += 1;
        let mut p = self.next.to_le_bytes().to_vec();
        put_str(&mut p, NAME);
        p.extend_from_slice(body);
        self.s.write_all(&encode(20, &p)).await.unwrap();
        loop {
            let f = read_frame(&mut self.s, 1 << 21).await.unwrap();
            if f.kind == 21 {
                assert_eq!(f.payload[..8], self.next.to_le_bytes());
                return f.payload[8];
            }
        }
    }
}

fn write(gen: u64, data: &[u8]) -> Vec<u8> {
    Request::Write {
        gen,
        offset: 0,
        fua: false,
        resync: false,
        data,
    }
    .encode()
}

#[test]
fn writes_from_a_stale_or_unagreed_primary_are_refused() {
    let p = primary_a(options());
    // Keep the real node a away, then speak as a with the right secret.
    p.proxy.cut();
    let b_addr = p.b.link.local_addr();
    let agreed = p.b.status().generations;
    let size = p.b.m().size();
    let state = |role, generations: Generations| State {
        role,
        data_size: size,
        generations,
        was_primary: true,
        inconsistent: false,
        incarnation: 1,
        node: "a".into(),
    };
    let before = p.b.data();
    p.rt.block_on(async {
        let mut s = TcpStream::connect(b_addr).await.unwrap();
        handshake::dial(&mut s, "a", "b", SECRET).await.unwrap();
        let mut raw = Raw { s, next: 0 };
        // No state yet: nothing agreed.
        assert_eq!(raw.request(&write(agreed.current, &[1; 4096])).await, 1);
        // Junk is an error answered, not a closed link.
        assert_eq!(raw.request(&[9, 9]).await, 1);
        // A primary of an older generation (a new replica's).
        raw.notice(&state(Role::Primary, Generations::fresh()))
            .await;
        assert_eq!(
            raw.request(&write(Generations::fresh().current, &[2; 4096]))
                .await,
            1
        );
        raw.notice(&state(Role::Primary, agreed)).await;
        // The agreed generation, but a write that claims another.
        assert_eq!(raw.request(&write(agreed.current ^ 1, &[3; 4096])).await, 1);
        // What a real primary of that generation sends is taken.
        assert_eq!(
            raw.request(&write(agreed.current, &pattern(4, 4096))).await,
            0
        );
        let s = p.b.status();
        assert_eq!(s.peer_role, Some(Role::Primary));
        assert_ne!(s.connection, Connection::Refused);
    });
    let after = p.b.data();
    assert!(after[..4096] == pattern(4, 4096)[..]);
    assert!(after[4096..] == before[4096..]);
}
