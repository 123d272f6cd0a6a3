//! The dev CA's server certificate works in a real rustls handshake, and a
//! client that trusts another CA refuses it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use gangway_auth::{client_config, server_config, DevCa};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const LOOPBACK: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::LOCALHOST),
    IpAddr::V6(Ipv6Addr::LOCALHOST),
];

/// Serves one TLS connection at a time on 127.0.0.1:0, echoing "pong" and
/// the negotiated ALPN protocol to whoever says "ping".
async fn start_server(ca: &DevCa) -> std::net::SocketAddr {
    let (chain, key) = ca.issue_server_cert(&["localhost"], &LOOPBACK).unwrap();
    let acceptor = TlsAcceptor::from(server_config(&chain, &key).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 4];
                if tls.read_exact(&mut buf).await.is_ok() && &buf == b"ping" {
                    let alpn = tls.get_ref().1.alpn_protocol().unwrap_or(b"-").to_vec();
                    let _ = tls.write_all(b"pong ").await;
                    let _ = tls.write_all(&alpn).await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    addr
}

async fn ping(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
) -> std::io::Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = TlsConnector::from(config).connect(name, tcp).await?;
    tls.write_all(b"ping").await?;
    let mut reply = String::new();
    tls.read_to_string(&mut reply).await?;
    Ok(reply)
}

#[tokio::test]
async fn handshake_with_the_dev_ca() {
    let ca = DevCa::generate();
    let addr = start_server(&ca).await;
    let config = client_config(&ca.cert_pem()).unwrap();

    let by_name = ping(
        addr,
        config.clone(),
        ServerName::try_from("localhost").unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(by_name, "pong -");

    let by_ip = ping(
        addr,
        config.clone(),
        ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()),
    )
    .await
    .unwrap();
    assert_eq!(by_ip, "pong -");

    // The server offers h2 and HTTP/1.1 by ALPN.
    let mut h2 = (*config).clone();
    h2.alpn_protocols = vec![b"h2".to_vec()];
    let reply = ping(
        addr,
        Arc::new(h2),
        ServerName::try_from("localhost").unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(reply, "pong h2");
}

#[tokio::test]
async fn a_client_trusting_another_ca_refuses_the_server() {
    let ca = DevCa::generate();
    let addr = start_server(&ca).await;
    let other = DevCa::generate();
    let config = client_config(&other.cert_pem()).unwrap();
    let err = ping(addr, config, ServerName::try_from("localhost").unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[tokio::test]
async fn a_name_not_in_the_certificate_is_refused() {
    let ca = DevCa::generate();
    let addr = start_server(&ca).await;
    let config = client_config(&ca.cert_pem()).unwrap();
    let err = ping(addr, config, ServerName::try_from("example.com").unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not valid for name"), "{err}");
}

#[test]
fn a_ca_reloaded_from_pem_issues_certificates_that_chain() {
    let ca = DevCa::generate();
    let again = DevCa::from_pem(&ca.cert_pem(), &ca.key_pem()).unwrap();
    let (chain, key) = again.issue_server_cert(&["localhost"], &[]).unwrap();
    gangway_auth::tls::verify_chain(&ca.cert_pem(), &chain, "localhost").unwrap();
    server_config(&chain, &key).unwrap();

    // A certificate with someone else's key is refused at load time.
    let other = DevCa::generate();
    let err = DevCa::from_pem(&ca.cert_pem(), &other.key_pem()).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let ca = DevCa::generate();
    let (chain, key) = ca.issue_server_cert(&["localhost"], &[]).unwrap();
    let (_, other_key) = ca.issue_server_cert(&["localhost"], &[]).unwrap();
    assert!(server_config(&chain, &other_key).is_err(), "mismatched key");
    assert!(server_config("", &key).is_err());
    assert!(server_config(&chain, "").is_err());
    assert!(client_config("not a pem").is_err());
    assert!(ca.issue_server_cert(&[], &[]).is_err());
    assert!(ca.issue_server_cert(&["bad name"], &[]).is_err());
    assert!(DevCa::from_pem("junk", &ca.key_pem()).is_err());
    assert!(DevCa::from_pem(&ca.cert_pem(), "junk").is_err());
}
