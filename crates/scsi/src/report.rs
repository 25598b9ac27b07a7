//! REPORT SUPPORTED OPERATION CODES and REPORT SUPPORTED TASK MANAGEMENT
//! FUNCTIONS (REPORT TARGET PORT GROUPS is in `alua`).

use scsi_api::ScsiResponse;

use crate::cdb::{be16, be32, put16, put32, truncate, u8_at};
use crate::commands::{has_service_actions, Command, COMMANDS};
use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::sense::Sense;

/// Command timeouts descriptor (SPC-4 6.35.4).
fn timeouts(c: &Command) -> [u8; 12] {
    let mut t = [0u8; 12];
    put16(&mut t, 0, 0x0A);
    put32(&mut t, 8, c.timeout);
    t
}

impl LogicalUnit {
    fn supported_commands(&self) -> impl Iterator<Item = &'static Command> + '_ {
        COMMANDS.iter().filter(|c| self.supports(c))
    }

    pub(crate) fn report_supported_opcodes(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let rctd = u8_at(cdb, 2) & 0x80 != 0;
        let options = u8_at(cdb, 2) & 0x07;
        let opcode = u8_at(cdb, 3);
        let sa = be16(cdb, 4);
        let alloc = be32(cdb, 6) as usize;
        let data = match options {
            0 => {
                let mut d = vec![0u8; 4];
                for c in self.supported_commands() {
                    let mut desc = [0u8; 8];
                    desc[0] = c.opcode;
                    put16(&mut desc, 2, u16::from(c.service_action.unwrap_or(0)));
                    desc[5] = (u8::from(rctd) << 1) | u8::from(c.service_action.is_some());
                    put16(&mut desc, 6, c.usage.len() as u16);
                    d.extend_from_slice(&desc);
                    if rctd {
                        d.extend_from_slice(&timeouts(c));
                    }
                }
                let len = (d.len() - 4) as u32;
                put32(&mut d, 0, len);
                d
            }
            1..=3 => {
                let with_sa = has_service_actions(opcode);
                if (options == 1 && with_sa) || (options == 2 && !with_sa) {
                    return Err(Sense::invalid_cdb(2, Some(2)).into());
                }
                let found = self.supported_commands().find(|c| {
                    c.opcode == opcode && (!with_sa || c.service_action.map(u16::from) == Some(sa))
                });
                let mut d = vec![0u8; 4];
                match found {
                    Some(c) => {
                        // SUPPORT 011b: supported in conformance with a standard.
                        d[1] = (u8::from(rctd) << 7) | 0x03;
                        put16(&mut d, 2, c.usage.len() as u16);
                        d.extend_from_slice(c.usage);
                        if rctd {
                            d.extend_from_slice(&timeouts(c));
                        }
                    }
                    // SUPPORT 001b: not supported.
                    None => d[1] = 0x01,
                }
                d
            }
            _ => return Err(Sense::invalid_cdb(2, Some(2)).into()),
        };
        Ok(ScsiResponse::with_data(truncate(data, alloc)))
    }

    pub(crate) fn report_supported_tmfs(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let repd = u8_at(cdb, 2) & 0x80 != 0;
        let alloc = be32(cdb, 6) as usize;
        // ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET,
        // TARGET RESET.
        let mut d = vec![0x80 | 0x40 | 0x10 | 0x08 | 0x02, 0, 0, 0];
        if repd {
            d.resize(16, 0);
            d[3] = 0x0C;
        }
        Ok(ScsiResponse::with_data(truncate(d, alloc)))
    }
}

#[cfg(test)]
mod tests {
    use crate::cdb::{be16, be32};
    use crate::lu::test_support::*;
    use scsi_api::status;

    fn rsoc(
        lu: &crate::LogicalUnit,
        rctd: bool,
        options: u8,
        opcode: u8,
        sa: u16,
    ) -> scsi_api::ScsiResponse {
        let s = sa.to_be_bytes();
        run(
            lu,
            &nexus("a"),
            &[
                0xA3,
                0x0C,
                (u8::from(rctd) << 7) | options,
                opcode,
                s[0],
                s[1],
                0,
                0,
                0xFF,
                0xFF,
                0,
                0,
            ],
            &[],
        )
    }

    #[test]
    fn all_commands_then_each_one() {
        let lu = lu();
        ready(&lu, &nexus("a"));
        let all = rsoc(&lu, false, 0, 0, 0).data_in;
        let len = be32(&all, 0) as usize;
        assert_eq!(len + 4, all.len());
        for d in all[4..].chunks(8) {
            let (opcode, sa, servactv) = (d[0], be16(d, 2), d[5] & 1 != 0);
            assert!(servactv || sa == 0);
            let one = rsoc(&lu, false, if servactv { 2 } else { 1 }, opcode, sa);
            assert_eq!(one.status, status::GOOD, "{opcode:#x}/{sa:#x}");
            assert_eq!(one.data_in[1] & 0x07, 3);
            assert_eq!(one.data_in[4], opcode);
            assert_eq!(usize::from(be16(&one.data_in, 2)), usize::from(be16(d, 6)));
            // The other option is refused.
            let wrong = rsoc(&lu, false, if servactv { 1 } else { 2 }, opcode, sa);
            assert_eq!(sense_of(&wrong).1, 0x24);
        }
    }

    #[test]
    fn timeouts_descriptors_and_unsupported() {
        let lu = lu();
        ready(&lu, &nexus("a"));
        let all = rsoc(&lu, true, 0, 0, 0).data_in;
        let mut pos = 4;
        while pos < all.len() {
            assert_eq!(all[pos + 5] & 0x02, 0x02);
            assert_eq!(be16(&all, pos + 8), 0x0A);
            pos += 20;
        }
        assert_eq!(pos, all.len());
        let one = rsoc(&lu, false, 1, 0xC5, 0).data_in;
        assert_eq!(one, vec![0, 1, 0, 0]);
        // DPO/FUA usage bits for READ(10).
        let one = rsoc(&lu, false, 1, 0x28, 0).data_in;
        assert_eq!(one[5] & 0x18, 0x18);
    }

    #[test]
    fn port_groups_and_tmfs() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let r = run(&lu, &a, &[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
        assert_eq!(
            r.data_in,
            vec![0, 0, 0, 12, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
        );
        let r = run(&lu, &a, &[0xA3, 0x0D, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[]);
        assert_eq!(r.data_in, vec![0xDA, 0, 0, 0]);
    }
}
