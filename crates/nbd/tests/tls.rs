//! NBD_OPT_STARTTLS with real clients: nbdinfo (libnbd, GnuTLS) and
//! qemu-img over TLS, and plain clients refused where TLS is required.

mod common;

use std::path::Path;
use std::sync::Arc;

use block::{BlockDevice, MemDevice};
use common::raw::Raw;
use common::{export, random_bytes, run, Running};
use nbd::proto::*;
use nbd::{Tls, TlsMode};

const MIB: u64 = 1 << 20;

/// A self-signed certificate for 127.0.0.1 in `dir`, named as qemu's
/// x509 credential directories name them, for both ends.
fn credentials(dir: &Path) {
    let (cert, key) = (dir.join("server-cert.pem"), dir.join("server-key.pem"));
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ],
    );
    // The client trusts it as its CA.
    std::fs::copy(&cert, dir.join("ca-cert.pem")).unwrap();
}

#[test]
fn clients_negotiate_tls_and_plain_ones_are_refused_where_it_is_required() {
    let dir = tempfile::tempdir().unwrap();
    credentials(dir.path());
    let dev = Arc::new(MemDevice::new(16 * MIB));
    let srv = Running::start(vec![("secure", export(dev.clone()))]);
    srv.server
        .set_tls(Some(Tls::from_dir(dir.path(), TlsMode::Require).unwrap()));

    // A plain client gets NBD_REP_ERR_TLS_REQD.
    let mut plain = Raw::connect(srv.addr).unwrap();
    assert_eq!(
        plain.go("secure", false, false, false),
        Err(REP_ERR_TLS_REQD)
    );

    let certs = dir.path().to_str().unwrap();
    let uri = format!("nbds://{}/secure?tls-certificates={certs}", srv.addr);
    let out = run("nbdinfo", &["--size", &uri]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (16 * MIB).to_string()
    );

    // qemu-img writes an image over TLS and reads it back.
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let data = random_bytes(16 * MIB as usize, 5);
    std::fs::write(&src, &data).unwrap();
    let creds = format!("tls-creds-x509,id=tls0,dir={certs},endpoint=client");
    let target = format!(
        "driver=nbd,host={},port={},export=secure,tls-creds=tls0",
        srv.addr.ip(),
        srv.addr.port()
    );
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "--object",
            &creds,
            "-f",
            "raw",
            src.to_str().unwrap(),
            "--target-image-opts",
            &target,
        ],
    );
    let mut on_device = vec![0; data.len()];
    dev.read_at(&mut on_device, 0).unwrap();
    assert!(
        on_device == data,
        "the device differs from the image written over TLS"
    );
    // Read back as a raw image whose file is the NBD export.
    let source = format!(
        "driver=raw,file.driver=nbd,file.host={},file.port={},file.export=secure,file.tls-creds=tls0",
        srv.addr.ip(),
        srv.addr.port()
    );
    run(
        "qemu-img",
        &[
            "convert",
            "--object",
            &creds,
            "--image-opts",
            &source,
            "-O",
            "raw",
            back.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the image read back over TLS differs"
    );

    // Where TLS is only offered, plain clients are served too.
    srv.server
        .set_tls(Some(Tls::from_dir(dir.path(), TlsMode::Allow).unwrap()));
    let mut plain = Raw::connect(srv.addr).unwrap();
    plain.go("secure", true, false, false).unwrap();
    assert_eq!(plain.read(1, 0, 4096).unwrap(), data[..4096]);
    let out = run("nbdinfo", &["--size", &uri]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (16 * MIB).to_string()
    );
    // Without TLS configured, NBD_OPT_STARTTLS is unsupported.
    srv.server.set_tls(None);
    let mut c = Raw::connect(srv.addr).unwrap();
    assert_eq!(c.option(OPT_STARTTLS, &[]).unwrap()[0].0, REP_ERR_UNSUP);
    // Bad credential files are refused with the file named.
    let missing = dir.path().join("nothere.pem");
    let key = dir.path().join("server-key.pem");
    let e = Tls::from_pem_files(&missing, &key, TlsMode::Allow)
        .err()
        .expect("a missing certificate is an error");
    assert!(e.to_string().contains("nothere.pem"), "{e}");
}
