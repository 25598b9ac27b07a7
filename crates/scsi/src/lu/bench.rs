use super::test_support::*;
use super::*;

/// Per-command cost of the SCSI layer on a RAM device; run with
/// `cargo test -p scsi --release -- --ignored --nocapture`.
#[test]
#[ignore]
fn read_and_write_4k_cost() {
    let lu = lu_with(64 << 20, LuConfig::default());
    let a = nexus("a");
    let registry = LuRegistry::new();
    ready(&lu, &a);
    let data = vec![7u8; 4096];
    for (name, opcode, out) in [
        ("READ(10)", 0x28u8, &[][..]),
        ("WRITE(10)", 0x2A, &data[..]),
    ] {
        let n = 200_000u32;
        let start = std::time::Instant::now();
        for i in 0..n {
            let lba = (i % 8192) * 8;
            let l = lba.to_be_bytes();
            let cdb = [opcode, 0, l[0], l[1], l[2], l[3], 0, 0, 8, 0];
            let r = run_with(&lu, &a, &cdb, out, &registry);
            assert_eq!(r.status, 0);
        }
        let per = start.elapsed() / n;
        println!("{name} 4 KiB: {per:?} per command");
    }
}
