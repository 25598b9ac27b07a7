//! One SCSI command on a connection: its state while data arrives and
//! while it runs, and how its result becomes Data-In / SCSI Response PDUs.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::exec::Finished;
use super::io::{OutPdu, StatSn};
use super::placed::Placed;
use crate::datain;
use crate::dataout::{Placement, WriteState};
use crate::negotiation::SessionParams;
use crate::pdu::initiator::Cdb;
use crate::pdu::target::{self, DataInStatus, Residual};
use crate::pdu::Bhs;
use bytes::Bytes;
use scsi_api::{status, FileRegion, HeldData, ScsiResponse, TaskAttr};

/// iSCSI Response codes of the SCSI Response PDU.
pub(crate) const RESPONSE_COMPLETED: u8 = 0x00;
pub(crate) const RESPONSE_TARGET_FAILURE: u8 = 0x01;

pub(crate) enum Phase {
    /// Waiting for write data.
    Collecting,
    /// A Data-Out sequence error failed the command; waiting for this many
    /// more F bits before answering.
    Draining { finals_left: u32 },
    /// Data complete, waiting for an ORDERED task ahead of it.
    Blocked,
    /// Running on the I/O pool. An aborted task's result is dropped.
    Executing {
        aborted: bool,
        finished: Arc<Finished>,
    },
}

pub(crate) struct Task {
    /// Distinguishes reuses of one ITT.
    pub serial: u64,
    pub itt: u32,
    pub lun_raw: [u8; 8],
    pub lun: u64,
    /// Holds a CmdSN window slot (not immediate).
    pub tracked: bool,
    pub attr: TaskAttr,
    pub cdb: Cdb,
    pub read: bool,
    pub write: bool,
    pub edtl: u32,
    /// Immediate data, kept as received.
    pub immediate: Bytes,
    /// Data-Out segments by buffer offset, kept as received and copied
    /// together only once the write starts: a buffer grown as bursts
    /// arrive copies its contents again at every growth.
    pub data: Vec<(usize, Bytes)>,
    pub write_state: Option<WriteState>,
    /// Bytes of the connection's write budget this task holds.
    pub reserved: u64,
    /// The budget for everything R2Ts will fetch is reserved (taken at
    /// once, before the first R2T).
    pub solicits_reserved: bool,
    pub phase: Phase,
    /// A write started before its data arrived, which takes its data as
    /// it comes instead of `immediate` and `data`.
    pub placed: Option<Placed>,
    /// Where the Data-Out being received into the started write goes, as
    /// its header was accepted; acted on once all its data is in.
    pub placing: Option<Placement>,
}

impl Task {
    /// How this task's response PDUs are shaped on a session with `params`.
    pub fn response_shape(&self, params: &SessionParams) -> ResponseShape {
        ResponseShape {
            itt: self.itt,
            read: self.read,
            write: self.write,
            edtl: self.edtl,
            r2ts: self.write_state.as_ref().map_or(0, |w| w.r2ts_sent()),
            initiator_mrdsl: params.initiator_mrdsl,
            max_burst_length: params.max_burst_length,
            tracked: self.tracked,
        }
    }
}

/// Hashes ITTs for the task table. SipHash guards against crafted keys,
/// but the table never holds more than the commands one connection may
/// have open (the CmdSN window and those waiting for Data-Out), so a
/// multiplicative hash does, at a fraction of the cost per lookup.
#[derive(Default, Clone, Copy)]
pub(crate) struct IttHasher(u64);

impl Hasher for IttHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b) ^ (self.0 as u32).rotate_left(8));
        }
    }

    fn write_u32(&mut self, n: u32) {
        let x = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Fold the well-mixed high half into the low bits too: the table
        // picks buckets by the low bits and tags by the high ones.
        self.0 = x ^ (x >> 32);
    }
}

/// The tasks of a connection by ITT.
pub(crate) type TaskTable = HashMap<u32, Task, BuildHasherDefault<IttHasher>>;

/// Task attribute of the SCSI Command ATTR field (RFC 7143 11.3.1.2).
pub(crate) fn task_attr(raw: u8) -> TaskAttr {
    match raw {
        // Untagged is treated as SIMPLE (SAM-5).
        0 | 1 => TaskAttr::Simple,
        2 => TaskAttr::Ordered,
        3 => TaskAttr::HeadOfQueue,
        4 => TaskAttr::Aca,
        _ => TaskAttr::Untagged,
    }
}

/// What shapes a command's response PDUs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResponseShape {
    pub itt: u32,
    pub read: bool,
    pub write: bool,
    pub edtl: u32,
    /// R2Ts sent for the command (counted in ExpDataSN).
    pub r2ts: u32,
    /// Initiator's MaxRecvDataSegmentLength.
    pub initiator_mrdsl: u32,
    pub max_burst_length: u32,
    /// The final PDU frees a CmdSN window slot.
    pub tracked: bool,
}

/// Residual for a finished command (RFC 7143 11.4.5).
///
/// Reads compare the expected length with what the command produced;
/// writes compare it with what the CDB asked for.
pub(crate) fn residual(shape: &ResponseShape, resp: &ScsiResponse) -> Residual {
    if shape.read {
        Residual::between(shape.edtl, resp.data_in_len() as u64)
    } else if let Some(wanted) = resp.data_out_wanted {
        Residual::between(shape.edtl, u64::from(wanted))
    } else if shape.write {
        // Data was sent but the command used none of it.
        Residual::between(shape.edtl, 0)
    } else if resp.data_in_len() > 0 {
        Residual::between(0, resp.data_in_len() as u64)
    } else {
        Residual::None
    }
}

/// A command's response PDUs: one for most commands, held in place.
pub(crate) type ResponsePdus = smallvec::SmallVec<[OutPdu; 1]>;

/// Turn a command's result into PDUs: Data-In segmented by the initiator's
/// MaxRecvDataSegmentLength and MaxBurstLength, status in the last Data-In
/// when there is no sense, a separate SCSI Response otherwise.
pub(crate) fn response_pdus(shape: &ResponseShape, resp: ScsiResponse) -> ResponsePdus {
    let residual = residual(shape, &resp);
    let mut data_in = DataIn::of(shape, resp.data_in, resp.data_in_file, resp.data_in_held);
    let collapse = data_in.len() > 0
        && resp.sense.is_empty()
        && matches!(resp.status, status::GOOD | status::CONDITION_MET);
    let mut out = ResponsePdus::new();
    let mut datasn = 0u32;
    for seg in datain::segments(
        data_in.len() as u32,
        shape.initiator_mrdsl,
        shape.max_burst_length,
    ) {
        let with_status = (collapse && seg.last).then_some(DataInStatus {
            status: resp.status,
            residual,
        });
        let bhs = target::data_in(shape.itt, seg.datasn, seg.offset, seg.final_, with_status);
        let statsn = if with_status.is_some() {
            StatSn::Advance
        } else {
            StatSn::Reserved
        };
        let mut pdu = data_in.pdu(bhs, seg.offset as usize, seg.len as usize, statsn);
        pdu.frees_window_slot = with_status.is_some() && shape.tracked;
        out.push(pdu);
        datasn = seg.datasn.wrapping_add(1);
    }
    if !collapse {
        let exp_datasn = datasn.wrapping_add(shape.r2ts);
        let bhs = target::scsi_response(
            shape.itt,
            RESPONSE_COMPLETED,
            resp.status,
            residual,
            exp_datasn,
        );
        let data = sense_segment(&resp.sense, shape.initiator_mrdsl);
        let mut pdu = OutPdu::new(bhs, data, StatSn::Advance);
        pdu.frees_window_slot = shape.tracked;
        out.push(pdu);
    }
    out
}

/// A command's Data-In, cut to the expected length: in memory, or a
/// region of a file that the writer sends from the file's pages.
enum DataIn {
    /// Bytes in memory; `pages` when they are a mapped file's, read only
    /// when sent.
    Memory {
        bytes: Bytes,
        pages: bool,
    },
    File(FileRegion),
}

impl DataIn {
    fn of(
        shape: &ResponseShape,
        memory: Vec<u8>,
        file: Option<FileRegion>,
        held: Option<HeldData>,
    ) -> DataIn {
        let limit = if shape.read { shape.edtl as usize } else { 0 };
        if let Some(mut region) = file {
            region.len = region.len.min(limit);
            return DataIn::File(region);
        }
        let (mut bytes, pages) = match held {
            Some(held) => {
                let pages = held.file_pages;
                (Bytes::from_owner(held), pages)
            }
            None if memory.capacity() >= 64 << 10 => (
                Bytes::from_owner(scsi_api::buffers::Recycled(memory)),
                false,
            ),
            None => (Bytes::from(memory), false),
        };
        bytes.truncate(limit);
        DataIn::Memory { bytes, pages }
    }

    fn len(&self) -> usize {
        match self {
            DataIn::Memory { bytes, .. } => bytes.len(),
            DataIn::File(r) => r.len,
        }
    }

    /// The PDU carrying `len` bytes from `offset`.
    fn pdu(&mut self, bhs: Bhs, offset: usize, len: usize, statsn: StatSn) -> OutPdu {
        match self {
            // All of it in one PDU (every short read) moves: a slice of a
            // buffer that came from a Vec allocates its shared count.
            DataIn::Memory { bytes, pages } => {
                let data = if offset == 0 && len == bytes.len() {
                    std::mem::take(bytes)
                } else {
                    bytes.slice(offset..offset + len)
                };
                let mut pdu = OutPdu::new(bhs, data, statsn);
                pdu.file_pages = *pages;
                pdu
            }
            DataIn::File(r) => {
                let mut pdu = OutPdu::new(bhs, Bytes::new(), statsn);
                pdu.file = Some(FileRegion {
                    file: r.file.clone(),
                    offset: r.offset + offset as u64,
                    len,
                });
                pdu
            }
        }
    }
}

/// A SCSI Response for a command the target could not run at all.
pub(crate) fn failure_pdu(shape: &ResponseShape) -> OutPdu {
    let bhs = target::scsi_response(
        shape.itt,
        RESPONSE_TARGET_FAILURE,
        0,
        Residual::None,
        shape.r2ts,
    );
    let mut pdu = OutPdu::new(bhs, Bytes::new(), StatSn::Advance);
    pdu.frees_window_slot = shape.tracked;
    pdu
}

/// A write's data for the SCSI layer: when `in_parts` and the pieces
/// follow each other from offset 0 with no gap or overlap, the pieces as
/// received (and no single buffer); otherwise one buffer ([`assemble`]).
pub(crate) fn data_out(
    immediate: Bytes,
    segments: Vec<(usize, Bytes)>,
    in_parts: bool,
) -> (Bytes, Vec<Bytes>) {
    let pieces = usize::from(!immediate.is_empty()) + segments.len();
    if !in_parts || pieces < 2 || !follow_each_other(&immediate, &segments) {
        return (assemble(immediate, segments), Vec::new());
    }
    let mut parts = Vec::with_capacity(pieces);
    if !immediate.is_empty() {
        parts.push(immediate);
    }
    parts.extend(segments.into_iter().map(|(_, data)| data));
    (Bytes::new(), parts)
}

fn follow_each_other(immediate: &Bytes, segments: &[(usize, Bytes)]) -> bool {
    let mut next = immediate.len();
    for (at, data) in segments {
        if *at != next {
            return false;
        }
        next += data.len();
    }
    true
}

/// A write's data in one buffer, from its immediate data (at offset 0)
/// and its Data-Out segments. One segment that is all the data is used as
/// it is. Bytes no segment covered (none should remain once the write is
/// complete) read as zeros, never as an earlier user's data.
pub(crate) fn assemble(immediate: Bytes, segments: Vec<(usize, Bytes)>) -> Bytes {
    // Every READ comes here with no data: no allocation for it.
    if segments.is_empty() {
        return immediate;
    }
    let mut all = Vec::with_capacity(segments.len() + 1);
    if !immediate.is_empty() {
        all.push((0, immediate));
    }
    all.extend(segments);
    if let [(0, only)] = all.as_slice() {
        return only.clone();
    }
    // Stable: of two segments at one offset, the later one arrived later.
    all.sort_by_key(|(offset, _)| *offset);
    let len = all.iter().map(|(at, d)| at + d.len()).max().unwrap_or(0);
    let mut buf = scsi_api::buffers::take_empty(len);
    for (at, d) in all {
        if at > buf.len() {
            buf.resize(at, 0);
        }
        // Overlapping what is already placed overwrites it, as it would in
        // a flat buffer.
        let (replace, append) = d.split_at((buf.len() - at).min(d.len()));
        buf[at..at + replace.len()].copy_from_slice(replace);
        buf.extend_from_slice(append);
    }
    Bytes::from_owner(scsi_api::buffers::Recycled(buf))
}

/// SenseLength + sense data, cut to what the initiator can receive.
fn sense_segment(sense: &[u8], mrdsl: u32) -> Bytes {
    if sense.is_empty() {
        return Bytes::new();
    }
    let len = sense.len().min(mrdsl as usize - 2).min(u16::MAX as usize);
    let mut v = Vec::with_capacity(len + 2);
    v.extend_from_slice(&(len as u16).to_be_bytes());
    v.extend_from_slice(&sense[..len]);
    Bytes::from(v)
}

/// Fixed-format sense with the given key and additional sense code.
fn fixed_sense(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = key;
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    s
}

/// ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR: how a command ends when
/// its Data-Out could not be received (RFC 3720 6.7).
pub(crate) fn protocol_service_crc_error_sense() -> Vec<u8> {
    fixed_sense(0x0b, 0x47, 0x05)
}

/// Fixed-format sense: ILLEGAL REQUEST, INVALID FIELD IN CDB. Used when the
/// transport refuses a command before the SCSI layer sees it.
pub(crate) fn invalid_field_in_cdb_sense() -> Vec<u8> {
    fixed_sense(0x05, 0x24, 0x00)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(read: bool, write: bool, edtl: u32) -> ResponseShape {
        ResponseShape {
            itt: 9,
            read,
            write,
            edtl,
            r2ts: 0,
            initiator_mrdsl: 8192,
            max_burst_length: 262144,
            tracked: true,
        }
    }

    #[test]
    fn write_data_in_parts_only_when_they_follow_each_other() {
        let seg = |offset: usize, fill: u8, len: usize| (offset, Bytes::from(vec![fill; len]));
        let immediate = Bytes::from(vec![1u8; 4]);
        let (whole, parts) = data_out(immediate.clone(), vec![seg(4, 2, 4), seg(8, 3, 2)], true);
        assert!(whole.is_empty());
        assert_eq!(parts, [&[1u8; 4][..], &[2; 4], &[3; 2]]);
        assert_eq!(parts[0].as_ptr(), immediate.as_ptr(), "not copied");
        let (_, parts) = data_out(Bytes::new(), vec![seg(0, 2, 4), seg(4, 3, 4)], true);
        assert_eq!(parts.len(), 2);
        // Out of order, with a gap, overlapping, a single piece, or a
        // command that wants one buffer: joined.
        for (immediate, segments, in_parts) in [
            (immediate.clone(), vec![seg(8, 3, 4), seg(4, 2, 4)], true),
            (immediate.clone(), vec![seg(6, 3, 4)], true),
            (immediate.clone(), vec![seg(2, 3, 4)], true),
            (Bytes::new(), vec![seg(0, 3, 4)], true),
            (immediate.clone(), vec![seg(4, 2, 4)], false),
        ] {
            let expect = assemble(immediate.clone(), segments.clone());
            let (whole, parts) = data_out(immediate, segments, in_parts);
            assert!(parts.is_empty());
            assert_eq!(whole, expect);
        }
    }

    #[test]
    fn write_data_is_assembled_at_its_offsets() {
        let seg = |offset: usize, fill: u8, len: usize| (offset, Bytes::from(vec![fill; len]));
        let immediate = Bytes::from(vec![1u8; 4]);
        // Out of order, one segment late.
        let buf = assemble(immediate.clone(), vec![seg(8, 3, 4), seg(4, 2, 4)]);
        assert_eq!(buf, [[1u8; 4], [2; 4], [3; 4]].concat());
        // Without immediate data; a later segment overlapping an earlier one
        // wins where they overlap.
        let buf = assemble(Bytes::new(), vec![seg(0, 5, 6), seg(4, 6, 4)]);
        assert_eq!(buf, [5, 5, 5, 5, 6, 6, 6, 6][..]);
        // A hole reads as zeros, even in a recycled buffer that held data.
        scsi_api::buffers::give_back(vec![0xEE; 64 << 10]);
        let buf = assemble(Bytes::new(), vec![seg(60 << 10, 7, 4 << 10)]);
        assert_eq!(buf.len(), 64 << 10);
        assert!(buf[..60 << 10].iter().all(|&b| b == 0));
        assert!(buf[60 << 10..].iter().all(|&b| b == 7));
        assert!(assemble(Bytes::new(), Vec::new()).is_empty());
        // All the data in one piece is not copied.
        let only = Bytes::from(vec![9u8; 100]);
        assert_eq!(assemble(only.clone(), Vec::new()).as_ptr(), only.as_ptr());
        let (_, single) = seg(0, 4, 50);
        assert_eq!(
            assemble(Bytes::new(), vec![(0, single.clone())]).as_ptr(),
            single.as_ptr()
        );
    }

    #[test]
    fn read_with_status_collapsed() {
        let pdus = response_pdus(
            &shape(true, false, 20000),
            ScsiResponse::with_data(vec![1; 20000]),
        );
        assert_eq!(pdus.len(), 3);
        assert!(pdus[..2]
            .iter()
            .all(|p| p.statsn == StatSn::Reserved && !p.frees_window_slot));
        let last = &pdus[2];
        assert_eq!(last.bhs.flags(), 0x81, "F and S, no residual");
        assert_eq!(last.statsn, StatSn::Advance);
        assert!(last.frees_window_slot);
        assert_eq!(last.data.len(), 20000 - 16384);
        assert_eq!(last.bhs.u32_at(36), 2, "DataSN");
    }

    #[test]
    fn read_from_a_file_is_cut_into_regions_of_it() {
        let file = Arc::new(std::fs::File::open("/dev/null").unwrap());
        let resp = ScsiResponse {
            data_in_file: Some(FileRegion {
                file,
                offset: 4096,
                len: 20000,
            }),
            ..ScsiResponse::default()
        };
        let pdus = response_pdus(&shape(true, false, 18000), resp);
        let regions: Vec<(u64, usize)> = pdus
            .iter()
            .map(|p| {
                assert!(p.data.is_empty());
                let r = p.file.as_ref().expect("a file region");
                (r.offset, r.len)
            })
            .collect();
        assert_eq!(
            regions,
            [(4096, 8192), (4096 + 8192, 8192), (4096 + 16384, 1616)],
            "cut to the expected length"
        );
        let last = &pdus[2];
        assert_eq!(last.bhs.flags(), 0x80 | 0x04 | 0x01, "F, overflow, S");
        assert_eq!(last.bhs.u32_at(44), 2000);
        assert_eq!(last.bhs.u32_at(40), 16384, "buffer offset");
    }

    #[test]
    fn read_held_in_a_device_buffer_is_sent_from_it() {
        let window: Vec<u8> = (0..20000u32).map(|i| i as u8).collect();
        let (at, expect) = (window.as_ptr() as usize, window.clone());
        let resp = ScsiResponse::with_held(HeldData::owned(Box::new(window)));
        let pdus = response_pdus(&shape(true, false, 18000), resp);
        assert_eq!(pdus.len(), 3);
        let sent: Vec<u8> = pdus.iter().flat_map(|p| p.data.to_vec()).collect();
        assert_eq!(sent, expect[..18000], "cut to the expected length");
        assert_eq!(pdus[0].data.as_ptr() as usize, at, "not copied");
        let last = &pdus[2];
        assert_eq!(last.bhs.flags(), 0x80 | 0x04 | 0x01, "F, overflow, S");
        assert_eq!(last.bhs.u32_at(44), 2000);
        assert!(pdus.iter().all(|p| !p.sends_file_pages()), "its own buffer");

        // A file's mapped pages count as pages for ORDERED tasks.
        let resp = ScsiResponse::with_held(HeldData::file_pages(Box::new(vec![5u8; 4096])));
        let pdus = response_pdus(&shape(true, false, 4096), resp);
        assert_eq!(pdus.len(), 1);
        assert!(pdus[0].sends_file_pages());
        assert_eq!(pdus[0].data[..], [5; 4096]);
    }

    #[test]
    fn a_short_read_allocates_nothing_for_its_response() {
        use crate::alloc_count::allocations;
        let data = vec![7u8; 4096];
        let at = data.as_ptr();
        let resp = ScsiResponse {
            data_in: data,
            ..ScsiResponse::default()
        };
        let (pdus, n) = allocations(|| response_pdus(&shape(true, false, 4096), resp));
        assert_eq!(n, 0, "the PDU is held in place and the data moves into it");
        assert_eq!(pdus.len(), 1);
        assert_eq!(pdus[0].data.as_ptr(), at);
        assert_eq!(pdus[0].data.len(), 4096);
        // A READ has no data to assemble.
        let (none, n) = allocations(|| data_out(Bytes::new(), Vec::new(), true));
        assert_eq!((none.0.len(), none.1.len(), n), (0, 0, 0));
    }

    #[test]
    fn read_underflow_and_overflow() {
        let pdus = response_pdus(
            &shape(true, false, 10000),
            ScsiResponse::with_data(vec![0; 512]),
        );
        assert_eq!(pdus.len(), 1);
        assert_eq!(pdus[0].bhs.flags(), 0x80 | 0x02 | 0x01);
        assert_eq!(pdus[0].bhs.u32_at(44), 9488);
        let pdus = response_pdus(
            &shape(true, false, 200),
            ScsiResponse::with_data(vec![0; 512]),
        );
        assert_eq!(pdus[0].data.len(), 200);
        assert_eq!(pdus[0].bhs.flags(), 0x80 | 0x04 | 0x01);
        assert_eq!(pdus[0].bhs.u32_at(44), 312);
    }

    #[test]
    fn read_of_zero_expected_length_reports_overflow_in_response() {
        let pdus = response_pdus(
            &shape(true, false, 0),
            ScsiResponse::with_data(vec![0; 512]),
        );
        assert_eq!(pdus.len(), 1);
        assert_eq!(pdus[0].bhs.opcode_raw(), 0x21);
        assert_eq!(pdus[0].bhs.flags(), 0x80 | 0x04);
        assert_eq!(pdus[0].bhs.u32_at(44), 512);
    }

    #[test]
    fn check_condition_goes_in_a_separate_response() {
        let mut resp = ScsiResponse::check_condition(vec![
            0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0,
        ]);
        resp.data_in = vec![7; 100];
        let pdus = response_pdus(&shape(true, false, 4096), resp);
        assert_eq!(pdus.len(), 2);
        assert_eq!(pdus[0].bhs.flags(), 0x80, "Data-In without status");
        let r = &pdus[1];
        assert_eq!(r.bhs.opcode_raw(), 0x21);
        assert_eq!(r.bhs.byte(3), status::CHECK_CONDITION);
        assert_eq!(r.bhs.u32_at(36), 1, "ExpDataSN counts the Data-In");
        assert_eq!(&r.data[..2], &[0, 18]);
        assert_eq!(r.data.len(), 20);
        assert_eq!(r.bhs.flags(), 0x80 | 0x02);
        assert_eq!(r.bhs.u32_at(44), 3996);
    }

    #[test]
    fn write_residuals_follow_what_the_cdb_wanted() {
        let mut resp = ScsiResponse::good();
        resp.data_out_wanted = Some(512);
        let pdus = response_pdus(&shape(false, true, 10000), resp);
        assert_eq!(pdus.len(), 1);
        assert_eq!((pdus[0].bhs.flags(), pdus[0].bhs.u32_at(44)), (0x82, 9488));
        let mut resp = ScsiResponse::good();
        resp.data_out_wanted = Some(512);
        let pdus = response_pdus(&shape(false, true, 0), resp);
        assert_eq!((pdus[0].bhs.flags(), pdus[0].bhs.u32_at(44)), (0x84, 512));
        let pdus = response_pdus(&shape(false, true, 512), ScsiResponse::good());
        assert_eq!((pdus[0].bhs.flags(), pdus[0].bhs.u32_at(44)), (0x82, 512));
    }

    #[test]
    fn no_data_no_residual() {
        let pdus = response_pdus(&shape(false, false, 0), ScsiResponse::good());
        assert_eq!(pdus.len(), 1);
        assert_eq!(pdus[0].bhs.flags(), 0x80);
        assert!(pdus[0].data.is_empty());
    }

    #[test]
    fn exp_datasn_counts_r2ts() {
        let mut s = shape(false, true, 1 << 20);
        s.r2ts = 4;
        let mut resp = ScsiResponse::good();
        resp.data_out_wanted = Some(1 << 20);
        let pdus = response_pdus(&s, resp);
        assert_eq!(pdus[0].bhs.u32_at(36), 4);
    }

    #[test]
    fn itt_hash_spreads_sequential_tags() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<IttHasher>::default();
        let buckets: std::collections::HashSet<u64> =
            (0u32..64).map(|itt| build.hash_one(itt) & 63).collect();
        assert!(buckets.len() > 32, "{} of 64 buckets used", buckets.len());
        assert_ne!(build.hash_one(1u32), build.hash_one(2u32));
    }

    #[test]
    fn task_attributes() {
        assert_eq!(task_attr(0), TaskAttr::Simple);
        assert_eq!(task_attr(2), TaskAttr::Ordered);
        assert_eq!(task_attr(3), TaskAttr::HeadOfQueue);
        assert_eq!(task_attr(7), TaskAttr::Untagged);
    }
}
