//! Verified I/O through every queue of a [`Host`]: what this crate's
//! tests and the daemon's run against a namespace, so both ask the same
//! of every device kind.

use super::{expect_success, nvm, Host};
use crate::status::Status;

/// Bytes that say where they were written.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Writes, reads back, flushes, zeroes, deallocates and compares and
/// writes on namespace `nsid` of block size `bs` through every queue;
/// panics on the first difference. Uses the first 800 blocks.
pub async fn verified_io(host: &mut Host, nsid: u32, bs: usize) {
    let queues = host.io.len();
    for (i, q) in host.io.iter_mut().enumerate() {
        let slba = (i * 64) as u64;
        // Small (in the capsule) and large (asked for with R2T, sent in
        // several H2CData PDUs) writes.
        for (blocks, seed) in [(2usize, 1u8), ((300 << 10) / bs, 2)] {
            let data = pattern(blocks * bs, seed + i as u8);
            let c = q
                .one(nvm::write(nsid, slba, data.clone(), bs, seed == 2))
                .await
                .unwrap();
            expect_success(&c, "write").unwrap();
            let c = q
                .one(nvm::read(nsid, slba, blocks as u32, bs))
                .await
                .unwrap();
            expect_success(&c, "read").unwrap();
            assert!(c.data == data, "queue {i}: read back what was written");
        }
        expect_success(&q.one(nvm::flush(nsid)).await.unwrap(), "flush").unwrap();
    }
    let q = &mut host.io[queues - 1];
    // Write Zeroes, plain and deallocating; Dataset Management.
    expect_success(
        &q.one(nvm::write_zeroes(nsid, 1, 1, false)).await.unwrap(),
        "write zeroes",
    )
    .unwrap();
    expect_success(
        &q.one(nvm::write_zeroes(nsid, 2, 2, true)).await.unwrap(),
        "write zeroes, deallocate",
    )
    .unwrap();
    expect_success(
        &q.one(nvm::deallocate(nsid, &[(5, 3), (64, 1)]))
            .await
            .unwrap(),
        "deallocate",
    )
    .unwrap();
    let back = q.one(nvm::read(nsid, 0, 8, bs)).await.unwrap().data;
    // Queue 0's last write there was the large one.
    assert!(back[..bs] == pattern(bs, 2)[..], "block 0 untouched");
    assert!(
        back[bs..4 * bs].iter().all(|b| *b == 0),
        "zeroed blocks read zeros"
    );
    assert!(
        back[5 * bs..8 * bs].iter().all(|b| *b == 0),
        "deallocated blocks read zeros"
    );
    let other = q.one(nvm::read(nsid, 64, 1, bs)).await.unwrap().data;
    assert!(
        other.iter().all(|b| *b == 0),
        "a deallocated block reads zeros"
    );
    // Compare and Write: refused on a mismatch, done on a match.
    let now = q.one(nvm::read(nsid, 200, 2, bs)).await.unwrap().data;
    let new = pattern(2 * bs, 99);
    let c = q
        .run(nvm::compare_and_write(
            nsid,
            200,
            new.clone(),
            new.clone(),
            bs,
        ))
        .await
        .unwrap();
    assert_eq!(
        (c[0].status(), c[1].status()),
        (Status::COMPARE_FAILURE, Status::FUSED_FAILED)
    );
    let back = q.one(nvm::read(nsid, 200, 2, bs)).await.unwrap().data;
    assert!(back == now, "a miscompare writes nothing");
    let c = q
        .run(nvm::compare_and_write(nsid, 200, now, new.clone(), bs))
        .await
        .unwrap();
    assert_eq!(
        (c[0].status(), c[1].status()),
        (Status::SUCCESS, Status::SUCCESS)
    );
    let back = q.one(nvm::read(nsid, 200, 2, bs)).await.unwrap().data;
    assert!(back == new, "a matching compare writes");
}
