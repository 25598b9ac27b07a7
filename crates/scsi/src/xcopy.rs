//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS.
//!
//! This LU acts as copy manager for block-to-block segment descriptors
//! (type 02h) between copy targets named by identification descriptors
//! (type E4h) holding an NAA designator, looked up in the daemon-wide
//! [`LuRegistry`](crate::LuRegistry): source and destination may sit
//! behind other targets.

use std::sync::Arc;

use scsi_api::{status, ScsiResponse};

use crate::cdb::{be16, be32, be64, put16, put32, truncate, u8_at};
use crate::commands::{sa, Access};
use crate::lu::{Ctx, LogicalUnit, Outcome, MAX_TRANSFER_BYTES};
use crate::nexus::CopyResult;
use crate::sense::{asc, io_sense, key, Failure, Sense};

pub const MAX_TARGET_DESCRIPTORS: usize = 2;
pub const MAX_SEGMENT_DESCRIPTORS: usize = 1;
pub const MAX_DESCRIPTOR_LIST_LENGTH: usize = 1024;
const TARGET_DESCRIPTOR_IDENTIFICATION: u8 = 0xE4;
const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;
/// Data moves through a buffer of this size.
const COPY_CHUNK: u64 = 1 << 20;
const LIST_ID_USAGE_DISCARD: u8 = 2;
const LIST_ID_USAGE_NONE: u8 = 3;

struct TargetDescriptor {
    designator: Vec<u8>,
    block_size: u32,
}

struct Segment {
    source: usize,
    destination: usize,
    /// Number of blocks, counted in destination blocks when `dc` is set.
    blocks: u64,
    dc: bool,
    source_lba: u64,
    destination_lba: u64,
}

fn copy_aborted(code: (u8, u8)) -> Failure {
    Sense::new(key::COPY_ABORTED, code).into()
}

/// Length of a target descriptor of type `kind` (SPC-4 6.4.5).
fn target_descriptor_length(kind: u8) -> usize {
    match kind {
        0xEA | 0xEB => 64,
        _ => 32,
    }
}

/// One kind of descriptor list (targets or segments): how a descriptor's
/// length is found, which kind is supported, and the limits.
struct DescriptorList {
    /// The descriptor's length from its first bytes, or `None` when too
    /// few bytes are left to tell.
    length: fn(&[u8], usize, usize) -> Option<usize>,
    supported: u8,
    max: usize,
    too_many: (u8, u8),
    unsupported: (u8, u8),
}

/// Walk the descriptors of `p[start..end]`, checking each one's length,
/// the count and the kind, and handing each whole descriptor and its
/// offset to `parse`.
fn walk<T>(
    p: &[u8],
    start: usize,
    end: usize,
    list: &DescriptorList,
    mut parse: impl FnMut(&[u8], usize) -> Result<T, Sense>,
) -> Result<Vec<T>, Sense> {
    let mut out = Vec::new();
    let mut pos = start;
    while pos < end {
        let len = (list.length)(p, pos, end).ok_or_else(Sense::param_list_length)?;
        if pos + len > end {
            return Err(Sense::param_list_length());
        }
        if out.len() == list.max {
            return Err(Sense::illegal(list.too_many));
        }
        if p[pos] != list.supported {
            return Err(Sense::illegal(list.unsupported).with_field(false, pos, None));
        }
        out.push(parse(&p[pos..pos + len], pos)?);
        pos += len;
    }
    Ok(out)
}

const TARGETS: DescriptorList = DescriptorList {
    length: |p, pos, _| Some(target_descriptor_length(p[pos])),
    supported: TARGET_DESCRIPTOR_IDENTIFICATION,
    max: MAX_TARGET_DESCRIPTORS,
    too_many: asc::TOO_MANY_TARGET_DESCRIPTORS,
    unsupported: asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE,
};

const SEGMENTS: DescriptorList = DescriptorList {
    length: |p, pos, end| (pos + 4 <= end).then(|| usize::from(be16(p, pos + 2)) + 4),
    supported: SEGMENT_BLOCK_TO_BLOCK,
    max: MAX_SEGMENT_DESCRIPTORS,
    too_many: asc::TOO_MANY_SEGMENT_DESCRIPTORS,
    unsupported: asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE,
};

fn parse_targets(p: &[u8], start: usize, end: usize) -> Result<Vec<TargetDescriptor>, Sense> {
    walk(p, start, end, &TARGETS, |d, pos| {
        // Only block devices can be copy targets of block segments. The
        // LU ID TYPE is ignored (SPC-4), and so is the obsolete NUL bit.
        if d[1] & 0x1F != 0 {
            return Err(Sense::invalid_param(pos + 1, Some(4)));
        }
        let designator_len = usize::from(d[7]).min(20);
        Ok(TargetDescriptor {
            designator: d[8..8 + designator_len].to_vec(),
            block_size: crate::cdb::be24(d, 29),
        })
    })
}

fn parse_segments(p: &[u8], start: usize, end: usize) -> Result<Vec<Segment>, Sense> {
    walk(p, start, end, &SEGMENTS, |d, pos| {
        if d.len() != 28 {
            return Err(Sense::invalid_param(pos + 2, None));
        }
        Ok(Segment {
            source: usize::from(be16(d, 4)),
            destination: usize::from(be16(d, 6)),
            blocks: u64::from(be16(d, 10)),
            dc: d[1] & 0x02 != 0,
            source_lba: be64(d, 12),
            destination_lba: be64(d, 20),
        })
    })
}

impl LogicalUnit {
    pub(crate) fn extended_copy(&self, ctx: &Ctx<'_>) -> Outcome {
        let len = be32(ctx.cdb(), 10) as usize;
        if len == 0 {
            return Ok(ScsiResponse::good());
        }
        if len < 16 {
            return Err(Sense::param_list_length().into());
        }
        let p = ctx.param(len)?;
        let list_id = p[0];
        let usage = (p[1] >> 3) & 0x03;
        if usage == 1 {
            return Err(Sense::invalid_param(1, Some(4)).into());
        }
        let target_len = usize::from(be16(p, 2));
        let segment_len = be32(p, 8) as usize;
        let inline_len = be32(p, 12) as usize;
        if 16 + target_len as u64 + segment_len as u64 + inline_len as u64 > len as u64
            || target_len + segment_len > MAX_DESCRIPTOR_LIST_LENGTH
        {
            return Err(Sense::param_list_length().into());
        }
        if inline_len != 0 {
            return Err(Sense::invalid_param(12, None).into());
        }
        let targets = parse_targets(p, 16, 16 + target_len)?;
        let segments = parse_segments(p, 16 + target_len, 16 + target_len + segment_len)?;

        let mut done = CopyResult {
            succeeded: false,
            segments_processed: 0,
            bytes: 0,
        };
        let outcome = self.run_segments(ctx, &targets, &segments, &mut done);
        done.succeeded = outcome.is_ok();
        if usage != LIST_ID_USAGE_NONE && usage != LIST_ID_USAGE_DISCARD {
            self.state.lock().nexus(ctx.nexus).hold_copy(list_id, done);
        }
        outcome.map(|()| ScsiResponse::good())
    }

    fn resolve(&self, ctx: &Ctx<'_>, t: &TargetDescriptor) -> Option<Arc<LogicalUnit>> {
        if t.designator == self.naa {
            return self.me.upgrade();
        }
        ctx.registry.find(&t.designator)
    }

    fn run_segments(
        &self,
        ctx: &Ctx<'_>,
        targets: &[TargetDescriptor],
        segments: &[Segment],
        done: &mut CopyResult,
    ) -> Result<(), Failure> {
        for s in segments {
            let (Some(st), Some(dt)) = (targets.get(s.source), targets.get(s.destination)) else {
                return Err(copy_aborted(asc::COPY_TARGET_NOT_REACHABLE));
            };
            let (Some(src), Some(dst)) = (self.resolve(ctx, st), self.resolve(ctx, dt)) else {
                return Err(copy_aborted(asc::COPY_TARGET_NOT_REACHABLE));
            };
            if st.block_size != src.block_size || dt.block_size != dst.block_size {
                return Err(copy_aborted(asc::NO_ADDITIONAL));
            }
            let bytes = s.blocks * u64::from(if s.dc { dst.block_size } else { src.block_size });
            if bytes % u64::from(src.block_size) != 0
                || bytes % u64::from(dst.block_size) != 0
                || bytes > MAX_TRANSFER_BYTES
            {
                return Err(copy_aborted(asc::NO_ADDITIONAL));
            }
            let src_blocks = bytes / u64::from(src.block_size);
            let dst_blocks = bytes / u64::from(dst.block_size);
            if src.check_range(s.source_lba, src_blocks).is_err()
                || dst.check_range(s.destination_lba, dst_blocks).is_err()
            {
                return Err(copy_aborted(asc::NO_ADDITIONAL));
            }
            // The other LUs apply their own reservations and protection.
            for (lu, access) in [(&src, Access::Read), (&dst, Access::Write)] {
                let st = lu.state.lock();
                let spc2_other = st.spc2.as_ref().is_some_and(|h| h != ctx.nexus);
                if spc2_other || st.pr.conflicts(ctx.nexus, access) {
                    return Err(Failure::Status(status::RESERVATION_CONFLICT));
                }
            }
            if let Err(sense) = dst.check_writable_through(ctx.protected.contains(&dst.naa)) {
                return Err(copy_aborted((sense.asc, sense.ascq)));
            }
            copy_offloaded(&src, s.source_lba, &dst, s.destination_lba, bytes)
                .unwrap_or_else(|| copy_bytes(&src, s.source_lba, &dst, s.destination_lba, bytes))
                .map_err(|e| copy_aborted((e.asc, e.ascq)))?;
            done.segments_processed += 1;
            done.bytes += bytes;
        }
        Ok(())
    }

    pub(crate) fn receive_copy_results(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let alloc = be32(cdb, 10) as usize;
        let data = match u8_at(cdb, 1) & 0x1F {
            sa::COPY_STATUS => {
                let result = self.state.lock().nexus(ctx.nexus).copy(u8_at(cdb, 2));
                let Some(r) = result else {
                    return Err(Sense::invalid_cdb(2, None).into());
                };
                let mut d = vec![0u8; 12];
                put32(&mut d, 0, 8);
                // COPY MANAGER STATUS: 01h completed, 02h completed with error.
                d[4] = if r.succeeded { 0x01 } else { 0x02 };
                put16(&mut d, 5, r.segments_processed);
                // TRANSFER COUNT UNITS: kibibytes.
                d[7] = 0x01;
                put32(&mut d, 8, u32::try_from(r.bytes >> 10).unwrap_or(u32::MAX));
                d
            }
            _ => self.copy_operating_parameters(),
        };
        Ok(ScsiResponse::with_data(truncate(data, alloc)))
    }

    fn copy_operating_parameters(&self) -> Vec<u8> {
        let implemented = [SEGMENT_BLOCK_TO_BLOCK, TARGET_DESCRIPTOR_IDENTIFICATION];
        let mut d = vec![0u8; 44];
        d[4] = 0x01; // SNLID: copies without a list identifier are fine
        put16(&mut d, 8, MAX_TARGET_DESCRIPTORS as u16);
        put16(&mut d, 10, MAX_SEGMENT_DESCRIPTORS as u16);
        put32(&mut d, 12, MAX_DESCRIPTOR_LIST_LENGTH as u32);
        put32(&mut d, 16, MAX_TRANSFER_BYTES as u32);
        // TOTAL CONCURRENT COPIES, MAXIMUM CONCURRENT COPIES
        put16(&mut d, 34, 64);
        d[36] = 64;
        // DATA SEGMENT GRANULARITY (log2 bytes)
        d[37] = self.block_size.trailing_zeros() as u8;
        d[43] = implemented.len() as u8;
        d.extend_from_slice(&implemented);
        let len = (d.len() - 4) as u32;
        put32(&mut d, 0, len);
        d
    }
}

/// Lets the destination device copy the segment itself (a thin volume
/// shares units with another volume of its pool). `None`: it cannot, the
/// data must be moved.
fn copy_offloaded(
    src: &LogicalUnit,
    src_lba: u64,
    dst: &LogicalUnit,
    dst_lba: u64,
    bytes: u64,
) -> Option<Result<(), Sense>> {
    let (from, to) = (src.offset(src_lba), dst.offset(dst_lba));
    let src_blocks = bytes / u64::from(src.block_size);
    let dst_blocks = bytes / u64::from(dst.block_size);
    // Both ranges stay locked for the whole segment; on one LU, the span
    // covering both, so that the LU's lock is taken once.
    let (_src_guard, _dst_guard) = if std::ptr::eq(src, dst) {
        let start = src_lba.min(dst_lba);
        let end = (src_lba + src_blocks).max(dst_lba + dst_blocks);
        (src.locks.lock(start, end - start, false), None)
    } else {
        (
            src.locks.lock(src_lba, src_blocks, false),
            Some(dst.locks.lock(dst_lba, dst_blocks, false)),
        )
    };
    let done = dst
        .device
        .copy_from(src.device.as_ref(), from, to, bytes)?
        .map_err(|e| io_sense(&e, true));
    Some(done.and_then(|()| {
        if dst.force_unit_access(false) {
            dst.device.flush().map_err(|e| io_sense(&e, true))
        } else {
            Ok(())
        }
    }))
}

/// Copies `bytes` from `src` at `src_lba` to `dst` at `dst_lba`, in
/// chunks, backwards when the ranges overlap on the same LU with the
/// destination after the source.
fn copy_bytes(
    src: &LogicalUnit,
    src_lba: u64,
    dst: &LogicalUnit,
    dst_lba: u64,
    bytes: u64,
) -> Result<(), Sense> {
    let (from, to) = (src.offset(src_lba), dst.offset(dst_lba));
    let same = std::ptr::eq(src, dst);
    let backwards = same && to > from && to < from + bytes;
    let chunks = bytes.div_ceil(COPY_CHUNK);
    let mut buf = vec![0u8; COPY_CHUNK.min(bytes) as usize];
    let fua = dst.force_unit_access(false);
    for i in 0..chunks {
        let i = if backwards { chunks - 1 - i } else { i };
        let at = i * COPY_CHUNK;
        let n = COPY_CHUNK.min(bytes - at);
        let buf = &mut buf[..n as usize];
        {
            let _g = src.locks.lock(
                (from + at) / u64::from(src.block_size),
                n / u64::from(src.block_size),
                false,
            );
            src.device
                .read_at(buf, from + at)
                .map_err(|e| io_sense(&e, false))?;
        }
        let _g = dst.locks.lock(
            (to + at) / u64::from(dst.block_size),
            n / u64::from(dst.block_size),
            false,
        );
        dst.device
            .write_at(buf, to + at, fua)
            .map_err(|e| io_sense(&e, true))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{naa_from_seed, LuConfig};
    use crate::lu::test_support::*;
    use crate::registry::LuRegistry;

    fn target(naa: &[u8; 16], block_size: u32) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = 0xE4;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = 16;
        d[8..24].copy_from_slice(naa);
        d[29..32].copy_from_slice(&block_size.to_be_bytes()[1..]);
        d
    }

    fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
        let mut d = vec![0u8; 28];
        d[0] = 0x02;
        d[3] = 0x18;
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        d
    }

    fn list(list_id: u8, usage: u8, targets: Vec<Vec<u8>>, segments: Vec<Vec<u8>>) -> Vec<u8> {
        let t: Vec<u8> = targets.concat();
        let s: Vec<u8> = segments.concat();
        let mut p = vec![0u8; 16];
        p[0] = list_id;
        p[1] = usage << 3;
        p[2..4].copy_from_slice(&(t.len() as u16).to_be_bytes());
        p[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
        p.extend_from_slice(&t);
        p.extend_from_slice(&s);
        p
    }

    fn xcopy_cdb(len: usize) -> Vec<u8> {
        let mut c = vec![0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        c.extend_from_slice(&(len as u32).to_be_bytes());
        c.extend_from_slice(&[0, 0]);
        c
    }

    fn write(lu: &LogicalUnit, lba: u32, fill: u8, blocks: u16) {
        let mut c = vec![0x2A, 0];
        c.extend_from_slice(&lba.to_be_bytes());
        c.push(0);
        c.extend_from_slice(&blocks.to_be_bytes());
        c.push(0);
        run(lu, &nexus("a"), &c, &vec![fill; usize::from(blocks) * 512]);
    }

    fn read(lu: &LogicalUnit, lba: u32, blocks: u16) -> Vec<u8> {
        let mut c = vec![0x28, 0];
        c.extend_from_slice(&lba.to_be_bytes());
        c.push(0);
        c.extend_from_slice(&blocks.to_be_bytes());
        c.push(0);
        run(lu, &nexus("a"), &c, &[]).data_in
    }

    #[test]
    fn copies_within_and_across_lus() {
        let a = lu();
        let b = lu_with(
            1 << 20,
            LuConfig {
                naa: naa_from_seed("b"),
                ..LuConfig::default()
            },
        );
        let registry = LuRegistry::new();
        registry.add(a.clone());
        registry.add(b.clone());
        let n = nexus("a");
        ready(&a, &n);
        ready(&b, &n);
        write(&a, 0, 0x5A, 8);
        let p = list(
            1,
            0,
            vec![target(&a.naa(), 512)],
            vec![segment(0, 0, 8, 0, 100)],
        );
        let r = run_with(&a, &n, &xcopy_cdb(p.len()), &p, &registry);
        assert_eq!(r.status, status::GOOD);
        assert_eq!(read(&a, 100, 8), vec![0x5A; 4096]);
        // Across LUs, issued to the destination.
        let p = list(
            2,
            0,
            vec![target(&a.naa(), 512), target(&b.naa(), 512)],
            vec![segment(0, 1, 8, 0, 7)],
        );
        assert_eq!(
            run_with(&b, &n, &xcopy_cdb(p.len()), &p, &registry).status,
            status::GOOD
        );
        assert_eq!(read(&b, 7, 8), vec![0x5A; 4096]);
        // Copy status is held for list 2 on b.
        let rcr = [0x84, 0x00, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
        let r = run_with(&b, &n, &rcr, &[], &registry);
        assert_eq!(
            (r.data_in[4], be16(&r.data_in, 5), be32(&r.data_in, 8)),
            (1, 1, 4)
        );
        let rcr = [0x84, 0x00, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
        assert_eq!(sense_of(&run_with(&b, &n, &rcr, &[], &registry)).1, 0x24);
    }

    /// A device that copies by itself: it records the copies it was asked
    /// for and does them, or declines them all.
    struct SelfCopying {
        offload: bool,
        asked: parking_lot::Mutex<Vec<(u64, u64, u64)>>,
    }

    impl block::Wrapper for SelfCopying {
        fn copy_from(
            &self,
            child: &dyn block::BlockDevice,
            src: &dyn block::BlockDevice,
            src_offset: u64,
            dst_offset: u64,
            len: u64,
        ) -> Option<std::io::Result<()>> {
            self.asked.lock().push((src_offset, dst_offset, len));
            if !self.offload {
                return None;
            }
            let mut buf = vec![0u8; len as usize];
            Some(
                src.read_at(&mut buf, src_offset)
                    .and_then(|()| child.write_at(&buf, dst_offset, false)),
            )
        }
        fn describe(&self, _: &dyn block::BlockDevice) -> String {
            "self-copying".into()
        }
    }

    #[test]
    fn the_destination_device_is_offered_the_copy_first() {
        for offload in [true, false] {
            let dev = Arc::new(block::Wrapped::over(
                Arc::new(block::MemDevice::new(1 << 20)),
                SelfCopying {
                    offload,
                    asked: parking_lot::Mutex::new(Vec::new()),
                },
            ));
            let config = LuConfig {
                naa: naa_from_seed("self"),
                ..LuConfig::default()
            };
            let b = LogicalUnit::new(dev.clone(), config).unwrap();
            let a = lu();
            let registry = LuRegistry::new();
            registry.add(a.clone());
            registry.add(b.clone());
            let n = nexus("a");
            ready(&a, &n);
            ready(&b, &n);
            write(&a, 3, 0x7E, 4);
            let p = list(
                1,
                0,
                vec![target(&a.naa(), 512), target(&b.naa(), 512)],
                vec![segment(0, 1, 4, 3, 10)],
            );
            let r = run_with(&b, &n, &xcopy_cdb(p.len()), &p, &registry);
            assert_eq!(r.status, status::GOOD);
            assert_eq!(*dev.asked.lock(), vec![(3 * 512, 10 * 512, 2048)]);
            // Done by the device, or by the fallback when it declined.
            assert_eq!(read(&b, 10, 4), vec![0x7E; 2048], "offload {offload}");
        }
    }

    #[test]
    fn overlapping_copy_on_one_lu_is_correct() {
        let a = lu();
        let n = nexus("a");
        ready(&a, &n);
        let data: Vec<u8> = (0..16 * 512).map(|i| (i / 512) as u8).collect();
        let mut c = vec![0x2A, 0, 0, 0, 0, 0, 0, 0, 16, 0];
        run(&a, &n, &c, &data);
        let p = list(
            1,
            3,
            vec![target(&a.naa(), 512)],
            vec![segment(0, 0, 16, 0, 4)],
        );
        assert_eq!(run(&a, &n, &xcopy_cdb(p.len()), &p).status, status::GOOD);
        c[0] = 0x28;
        c[5] = 4;
        assert_eq!(run(&a, &n, &c, &[]).data_in, data);
    }

    #[test]
    fn parameter_validation() {
        let a = lu();
        let n = nexus("a");
        ready(&a, &n);
        let t = target(&a.naa(), 512);
        let s = segment(0, 0, 1, 0, 1);
        let ok = list(1, 0, vec![t.clone()], vec![s.clone()]);
        // Length zero is a no-op; truncations are length errors.
        assert_eq!(run(&a, &n, &xcopy_cdb(0), &[]).status, status::GOOD);
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(16 + 31), &ok[..47])).1,
            0x1A
        );
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(ok.len() - 1), &ok[..ok.len() - 1])).1,
            0x1A
        );
        let too_many = list(1, 0, vec![t.clone(), t.clone(), t.clone()], vec![s.clone()]);
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(too_many.len()), &too_many)),
            (5, 0x26, 0x06)
        );
        let too_many = list(1, 0, vec![t.clone()], vec![s.clone(), s.clone()]);
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(too_many.len()), &too_many)),
            (5, 0x26, 0x08)
        );
        let mut fc = t.clone();
        fc[0] = 0xE0;
        let bad = list(1, 0, vec![fc], vec![s.clone()]);
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(bad.len()), &bad)),
            (5, 0x26, 0x07)
        );
        let mut stream = vec![0u8; 20];
        stream[0] = 0x03;
        stream[3] = 0x10;
        let bad = list(1, 0, vec![t.clone()], vec![stream]);
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(bad.len()), &bad)),
            (5, 0x26, 0x09)
        );
        // Unknown target index and a range beyond the end: COPY ABORTED.
        let bad = list(1, 0, vec![t.clone()], vec![segment(0, 1, 1, 0, 1)]);
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(bad.len()), &bad)),
            (key::COPY_ABORTED, 0x0D, 0x02)
        );
        let bad = list(
            1,
            0,
            vec![t.clone()],
            vec![segment(0, 0, 8, 0, a.blocks() - 1)],
        );
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(bad.len()), &bad)),
            (key::COPY_ABORTED, 0, 0)
        );
        let mut unknown = t;
        unknown[8] ^= 0xFF;
        let bad = list(1, 0, vec![unknown], vec![s]);
        assert_eq!(
            sense_of(&run(&a, &n, &xcopy_cdb(bad.len()), &bad)).0,
            key::COPY_ABORTED
        );
    }

    #[test]
    fn operating_parameters() {
        let a = lu();
        let n = nexus("a");
        ready(&a, &n);
        let rcr = [0x84, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
        let d = run(&a, &n, &rcr, &[]).data_in;
        assert_eq!(be32(&d, 0) as usize + 4, d.len());
        assert_eq!(be16(&d, 8), 2);
        assert_eq!(be16(&d, 10), 1);
        assert_eq!(be32(&d, 12), 1024);
        assert_eq!(&d[43..], vec![2, 0x02, 0xE4]);
    }
}
