use super::*;

fn request(extended: bool, flags: u16, kind: u16, offset: u64, len: u64) -> Vec<u8> {
    let mut b = Vec::new();
    let magic = if extended {
        EXTENDED_REQUEST_MAGIC
    } else {
        REQUEST_MAGIC
    };
    b.extend_from_slice(&magic.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&7u64.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    if extended {
        b.extend_from_slice(&len.to_be_bytes());
    } else {
        b.extend_from_slice(&(len as u32).to_be_bytes());
    }
    b
}

fn agreed() -> Agreed {
    Agreed {
        size: 1 << 20,
        read_only: false,
        structured: true,
        extended: false,
        block_status: true,
        max_payload: 1 << 16,
    }
}

#[test]
fn compact_and_extended_headers_decode() {
    let h = decode_request(
        &request(false, CMD_FLAG_FUA, CMD_WRITE, 4096, 512),
        false,
        1 << 16,
    )
    .unwrap();
    assert_eq!(
        (h.kind, h.cookie, h.offset, h.length),
        (CMD_WRITE, 7, 4096, 512)
    );
    assert_eq!(h.payload_len(false), 512);
    let big = 1u64 << 40;
    let h = decode_request(&request(true, 0, CMD_TRIM, 0, big), true, 1 << 16).unwrap();
    assert_eq!((h.length, h.payload_len(true)), (big, 0));
    // Compact magic in extended mode, and the other way round.
    assert!(matches!(
        decode_request(&request(false, 0, CMD_READ, 0, 1), true, 1 << 16),
        Err(DecodeError::Short { .. }) | Err(DecodeError::BadMagic(_))
    ));
    assert_eq!(
        decode_request(&request(true, 0, CMD_READ, 0, 1), false, 1 << 16),
        Err(DecodeError::BadMagic(EXTENDED_REQUEST_MAGIC as u64))
    );
}

#[test]
fn an_oversized_write_payload_breaks_the_connection() {
    let e = decode_request(&request(false, 0, CMD_WRITE, 0, 1 << 20), false, 1 << 16);
    assert!(matches!(e, Err(DecodeError::PayloadTooBig { .. })));
    // A read of the same length has no payload: refused, not fatal.
    let h = decode_request(&request(false, 0, CMD_READ, 0, 1 << 20), false, 1 << 16).unwrap();
    assert_eq!(check_request(&h, &agreed()).unwrap_err().error, EOVERFLOW);
}

#[test]
fn requests_are_checked_against_the_session() {
    let s = agreed();
    let check = |flags, kind, offset, len| {
        let h = decode_request(&request(false, flags, kind, offset, len), false, 1 << 16).unwrap();
        check_request(&h, &s)
    };
    assert_eq!(
        check(0, CMD_READ, 0, 4096),
        Ok(Command::Read {
            offset: 0,
            len: 4096,
            df: false
        })
    );
    assert_eq!(
        check(0, CMD_READ, (1 << 20) - 1, 2).unwrap_err().error,
        EINVAL
    );
    assert_eq!(
        check(CMD_FLAG_NO_HOLE, CMD_READ, 0, 1).unwrap_err().error,
        EINVAL
    );
    assert_eq!(check(0, 99, 0, 1).unwrap_err().error, EINVAL);
    assert_eq!(check(0, CMD_BLOCK_STATUS, 0, 0).unwrap_err().error, EINVAL);
    assert_eq!(check(0, CMD_FLUSH, u64::MAX, 0), Ok(Command::Flush));
    let ro = Agreed {
        read_only: true,
        ..s
    };
    let h = decode_request(&request(false, 0, CMD_TRIM, 0, 1), false, 1 << 16).unwrap();
    assert_eq!(check_request(&h, &ro).unwrap_err().error, EPERM);
}

#[test]
fn option_data_is_parsed_or_invalid() {
    let mut go = 3u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"vm1");
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    assert_eq!(
        parse_info_request(&go),
        Ok(InfoRequest {
            name: "vm1".into(),
            infos: vec![INFO_BLOCK_SIZE]
        })
    );
    assert!(parse_info_request(&go[..go.len() - 1]).is_err());
    let mut long = go.clone();
    long.push(0);
    assert!(parse_info_request(&long).is_err());
    assert!(parse_info_request(&u32::MAX.to_be_bytes()).is_err());

    let mut meta = 0u32.to_be_bytes().to_vec();
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
    meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
    assert_eq!(
        parse_meta_request(&meta).unwrap().queries,
        vec![BASE_ALLOCATION.to_string()]
    );
    // A count far beyond the data fails without reserving for it.
    let mut lying = 0u32.to_be_bytes().to_vec();
    lying.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(parse_meta_request(&lying).is_err());
}

#[test]
fn replies_have_the_documented_layout() {
    assert_eq!(chunk_header(false, 1, 2, 3, 4, 5).len(), 20);
    assert_eq!(chunk_header(true, 1, 2, 3, 4, 5).len(), 32);
    assert_eq!(
        &chunk_header(true, 1, 2, 3, 4, 5)[16..24],
        &4u64.to_be_bytes()
    );
    let (kind, p) = block_status_payload(false, 1, &[Extent { len: 10, flags: 3 }]);
    assert_eq!((kind, p.len()), (REPLY_TYPE_BLOCK_STATUS, 12));
    let (kind, p) = block_status_payload(true, 1, &[Extent { len: 10, flags: 3 }]);
    assert_eq!((kind, p.len()), (REPLY_TYPE_BLOCK_STATUS_EXT, 24));
    assert_eq!(option_reply(OPT_GO, REP_ACK, &[]).len(), 20);
    assert_eq!(export_name_reply(1, 1, true).len(), 134);
}
