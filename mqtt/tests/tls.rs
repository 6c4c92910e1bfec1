//! TLS sessions against a real Mosquitto with a TLS listener and a test CA made with `openssl`:
//! the broker's certificate verifies against the configured CA file and a full session works
//! over it; without that CA (the Mozilla roots) the handshake is refused naming TLS; a plain
//! client on the TLS port gets no session; a missing CA file is a clear error before dialing.

mod common;

use std::path::Path;
use std::process::Command;

use common::{next_delivery, options, unique, Broker};
use wharf_mqtt::{AckOutcome, MqttError, QoS, Session, TlsOptions};

/// A CA and a server certificate for 127.0.0.1/localhost signed by it, in `dir`.
fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=wharf-test-ca"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
    run(&ca);
    let mut csr = vec!["req", "-new", "-subj", "/CN=localhost"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr"]);
    run(&csr);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write the extension file");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
}

/// Mosquitto drops root to its own user: let it read the test's files.
fn readable_by_all(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .expect("chmod file");
    }
}

fn tls_broker(certs: &Path) -> Broker {
    let extra = format!(
        "cafile {0}/ca.crt\ncertfile {0}/server.crt\nkeyfile {0}/server.key\n",
        certs.display()
    );
    Broker::start(&extra)
}

#[tokio::test]
async fn a_session_over_tls_verifies_the_broker_and_works() {
    let certs = tempfile::tempdir().expect("temp dir");
    make_certificates(certs.path());
    readable_by_all(certs.path());
    let broker = tls_broker(certs.path());
    let tls = TlsOptions::from_files(Some(&certs.path().join("ca.crt")), None).expect("the CA");

    for host in ["127.0.0.1", "localhost"] {
        let mut opts = options(broker.port, &unique("tls"));
        opts.host = host.to_string();
        opts.tls = Some(tls.clone());
        let (handle, mut deliveries) = Session::connect(opts).await.expect("a TLS session");
        let topic = unique("tls/topic");
        let reasons = handle
            .subscribe(vec![(topic.clone(), QoS::AtLeastOnce)], None)
            .await
            .expect("SUBSCRIBE over TLS");
        assert_eq!(reasons[0].granted(), Some(QoS::AtLeastOnce));
        handle
            .publish(&topic, &b"over tls"[..], QoS::AtLeastOnce, false)
            .await
            .expect("PUBLISH over TLS");
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(&delivery.payload[..], b"over tls");
        assert_eq!(handle.ack(&delivery).await, AckOutcome::Sent);
    }
}

#[tokio::test]
async fn a_broker_the_roots_do_not_vouch_for_is_refused() {
    let certs = tempfile::tempdir().expect("temp dir");
    make_certificates(certs.path());
    readable_by_all(certs.path());
    let broker = tls_broker(certs.path());
    let mut opts = options(broker.port, &unique("tls-untrusted"));
    opts.tls = Some(TlsOptions::from_files(None, None).expect("the Mozilla roots"));
    let Err(refused) = Session::connect(opts).await else {
        panic!("a broker the roots do not vouch for was accepted");
    };
    let text = refused.to_string();
    assert!(text.contains("TLS handshake failed"), "{text}");

    // A plain client on the TLS port never gets a session.
    let plain = Session::connect(options(broker.port, &unique("plain-on-tls"))).await;
    assert!(
        plain.is_err(),
        "a plain CONNECT on a TLS listener must fail"
    );
}

#[test]
fn unusable_tls_files_are_named_before_anything_connects() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nope.crt");
    match TlsOptions::from_files(Some(&missing), None) {
        Err(MqttError::TlsFile { file, .. }) => assert!(file.ends_with("nope.crt")),
        other => panic!("expected a TLS file error, got {other:?}"),
    }
    let empty = dir.path().join("empty.crt");
    std::fs::write(&empty, "not a certificate").expect("write");
    let e = TlsOptions::from_files(Some(&empty), None).expect_err("no certificate");
    assert!(e.to_string().contains("no PEM certificate"), "{e}");
}
