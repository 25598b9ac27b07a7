//! iSCSI target transport (RFC 7143).
