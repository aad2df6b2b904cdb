//! HTTPS (`server.ssl_certfile`, `server.ssl_keyfile`): a client that trusts the test CA gets
//! answers over TLS and a plain-HTTP request gets none; with `server.ssl_ca_certs` a client
//! without a certificate the CA signed is turned away in the handshake and one with it is
//! answered; failed handshakes are counted in `/metrics`; with `server.ssl_refresh_s` a renewed
//! certificate reaches new connections without a restart, and a broken one leaves the one in
//! use. The certificates are the test-only ones in `tests/fixtures/tls` (see its README).

use super::common::*;
use dsv4_server::ServerConfig;
use dsv4_server::tls::TlsFiles;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// A server configuration serving the test certificate, asking for client certificates
/// signed by the test CA when `mutual`.
fn https(mutual: bool) -> ServerConfig {
    ServerConfig {
        tls: Some(TlsFiles {
            certfile: fixture("server.pem"),
            keyfile: fixture("server.key"),
            ca_certs: mutual.then(|| fixture("ca.pem")),
            refresh: None,
        }),
        ..config()
    }
}

/// A TLS client connector that trusts the test CA (presenting the test client certificate
/// when `client_cert`).
fn connector(client_cert: bool) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(fixture("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if client_cert {
        let chain: Vec<_> = CertificateDer::pem_file_iter(fixture("client.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(fixture("client.key")).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    TlsConnector::from(Arc::new(config))
}

/// `GET path` over TLS from a client that trusts the test CA (presenting the test client
/// certificate when `client_cert`): the raw response, or why there was none.
async fn https_get(addr: SocketAddr, path: &str, client_cert: bool) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector(client_cert)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out)
        .await
        .map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A counter of a server's `/metrics`, read over TLS (with the client certificate when
/// `client_cert`).
async fn tls_counter(addr: SocketAddr, name: &str, client_cert: bool) -> u64 {
    let text = https_get(addr, "/metrics", client_cert).await.unwrap();
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .parse()
        .unwrap()
}

/// `dsv4:tls_handshake_failures_total`.
const HANDSHAKE_FAILURES: &str = "dsv4:tls_handshake_failures_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_answers_over_tls_and_plain_http_gets_no_answer() {
    let s = start(https(false)).await;
    let models = https_get(s.addr, "/v1/models", false).await.unwrap();
    assert!(models.starts_with("HTTP/1.1 200"), "{models}");
    assert!(models.contains(MODEL), "{models}");
    assert_eq!(tls_counter(s.addr, HANDSHAKE_FAILURES, false).await, 0);

    // A plain-HTTP client on the TLS port gets no HTTP answer (at most a TLS alert), and the
    // server goes on.
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut back = Vec::new();
    let _ = tcp.read_to_end(&mut back).await;
    assert!(
        !back.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&back)
    );
    let health = https_get(s.addr, "/health", false).await.unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert_eq!(tls_counter(s.addr, HANDSHAKE_FAILURES, false).await, 1);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_when_a_client_ca_is_set() {
    let s = start(https(true)).await;
    // Without a certificate: turned away (TLS 1.3 clients learn it at their first read).
    let refused = https_get(s.addr, "/health", false).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("handshake") || e.contains("read")),
        "{refused:?}"
    );
    let ok = https_get(s.addr, "/health", true).await.unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert_eq!(tls_counter(s.addr, HANDSHAKE_FAILURES, true).await, 1);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_certificate_stops_the_server_before_it_listens() {
    let cfg = ServerConfig {
        tls: Some(TlsFiles {
            certfile: fixture("server.pem"),
            keyfile: fixture("other.key"),
            ca_certs: None,
            refresh: None,
        }),
        ..config()
    };
    let state = dsv4_server::AppState::new(cfg).unwrap();
    let e = dsv4_server::Server::bind(state).await.err().unwrap();
    assert!(e.to_string().contains("server.ssl_keyfile"), "{e}");
}

/// The leaf certificate (DER) a server presents to a client that trusts the test CA.
async fn served_certificate(addr: SocketAddr) -> Vec<u8> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector(false)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// The first certificate of a PEM fixture, as DER.
fn der(name: &str) -> Vec<u8> {
    CertificateDer::from_pem_file(fixture(name))
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_reaches_new_connections_and_a_broken_one_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(fixture("server.pem"), &cert).unwrap();
    std::fs::copy(fixture("server.key"), &key).unwrap();
    let s = start(ServerConfig {
        tls: Some(TlsFiles {
            certfile: cert.clone(),
            keyfile: key.clone(),
            ca_certs: None,
            refresh: Some(std::time::Duration::from_millis(50)),
        }),
        ..config()
    })
    .await;
    assert_eq!(served_certificate(s.addr).await, der("server.pem"));
    assert_eq!(
        tls_counter(s.addr, "dsv4:tls_reloads_total", false).await,
        0
    );

    // Renewed: the key first, then the certificate (a check between the two sees a mismatch).
    std::fs::copy(fixture("renewed.key"), &key).unwrap();
    std::fs::copy(fixture("renewed.pem"), &cert).unwrap();
    let renewed = der("renewed.pem");
    eventually("the renewed certificate served", async || {
        served_certificate(s.addr).await == renewed
    })
    .await;
    assert!(tls_counter(s.addr, "dsv4:tls_reloads_total", false).await >= 1);

    // Broken: the certificate in use stays, and the failure is counted.
    let failed = tls_counter(s.addr, "dsv4:tls_reload_failures_total", false).await;
    std::fs::write(&cert, "not a certificate").unwrap();
    eventually("the broken file counted", async || {
        tls_counter(s.addr, "dsv4:tls_reload_failures_total", false).await > failed
    })
    .await;
    assert_eq!(served_certificate(s.addr).await, renewed);
    s.shutdown().await.unwrap();
}
