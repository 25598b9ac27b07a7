//! SCSI command set (SPC-4 / SBC-3) for logical units backed by block devices.
