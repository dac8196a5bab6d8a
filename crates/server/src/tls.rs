//! A connection's transport, plain TCP or TLS ([`Conn`]), and the TLS server
//! configuration the `tls-*` parameters describe ([`server_config`]).
//!
//! TLS is rustls on its `ring` provider (TLS 1.2 and 1.3), driven without
//! blocking on the worker that owns the connection: a read feeds the socket's
//! bytes to rustls and takes the plaintext it decrypted (running the
//! handshake meanwhile), a write encrypts into rustls's bounded send buffer
//! and pushes records to the socket; records that did not fit in the socket
//! stay queued, and [`Conn::wants_write`] tells the worker to wait for the
//! socket to become writable. The plain path is one `match` away from the
//! bare socket.

use crate::config::{Config, TlsAuth};
use mio::event::Source;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, ErrorKind, Read, Write};
use std::sync::Arc;

/// A client connection's transport.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsConn>),
}

/// A TLS connection: the socket and rustls's state for it.
pub(crate) struct TlsConn {
    sock: TcpStream,
    tls: ServerConnection,
    /// The peer's close_notify, or the socket's end of stream, was read: the
    /// next read says end of stream.
    closed: bool,
}

impl Conn {
    /// A TLS connection on `sock`, its handshake still to come.
    pub(crate) fn tls(sock: TcpStream, cfg: Arc<ServerConfig>) -> Result<Conn, rustls::Error> {
        Ok(Conn::Tls(Box::new(TlsConn {
            sock,
            tls: ServerConnection::new(cfg)?,
            closed: false,
        })))
    }

    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }

    /// A read that came back short did not drain everything: the end of
    /// the stream (the peer's close_notify) came with the data and is still
    /// to be reported, which no new socket event would announce.
    #[inline]
    pub(crate) fn end_pending(&self) -> bool {
        match self {
            Conn::Plain(_) => false,
            Conn::Tls(t) => t.closed,
        }
    }

    /// TLS records are queued for the socket (handshake messages, alerts,
    /// encrypted replies the socket had no room for).
    #[inline]
    pub(crate) fn wants_write(&self) -> bool {
        match self {
            Conn::Plain(_) => false,
            Conn::Tls(t) => t.tls.wants_write(),
        }
    }

    /// Writes queued TLS records to the socket, as far as it takes them.
    #[inline]
    pub(crate) fn push_pending(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(_) => Ok(()),
            Conn::Tls(t) => t.push().map(|_| ()),
        }
    }

    /// Before the socket closes: TLS says so with a `close_notify` alert
    /// (best effort: what the socket does not take at once is dropped).
    pub(crate) fn close_notify(&mut self) {
        if let Conn::Tls(t) = self {
            t.tls.send_close_notify();
            let _ = t.push();
        }
    }

    fn tcp(&mut self) -> &mut TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(t) => &mut t.sock,
        }
    }
}

impl Read for Conn {
    /// Plain: one `read(2)`. TLS: the plaintext rustls has, decrypting what
    /// the socket holds until `buf` is full or the socket is empty (a short
    /// read therefore means the socket was drained, as for plain TCP). `Ok(0)`
    /// is the end of the stream (a `close_notify`, or a TCP end of stream
    /// without one); a TLS protocol error (a failed handshake, a peer that
    /// does not speak TLS) is an `InvalidData` error, after the alert that
    /// tells the peer why was sent.
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Conn {
    /// Plain: one `write(2)`. TLS: encrypts a prefix of `buf` into rustls's
    /// send buffer (bounded, 64 KiB by default) and pushes records to the
    /// socket; `WouldBlock` when records from before are still waiting for
    /// room in the socket. Never `Ok(0)` for a non-empty `buf`.
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push_pending()
    }
}

impl TlsConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.tls.reader().read(&mut buf[n..]) {
                // A close_notify: the end of the stream once `n` is taken.
                Ok(0) => {
                    self.closed = true;
                    return Ok(n);
                }
                Ok(k) => {
                    n += k;
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // The socket's end of stream without a close_notify: an end
                // of stream as plain TCP has it.
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                    self.closed = true;
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
            match self.tls.read_tls(&mut self.sock) {
                // The reader says end of stream on the next turn.
                Ok(0) => {}
                Ok(_) => {
                    if let Err(e) = self.tls.process_new_packets() {
                        // rustls queued an alert saying why: send it.
                        let _ = self.push();
                        return Err(io::Error::new(ErrorKind::InvalidData, e));
                    }
                    // Handshake messages, or a key update's answer.
                    if self.tls.wants_write() {
                        self.push()?;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return if n > 0 { Ok(n) } else { Err(e) };
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // What was encrypted before goes first, so that the send buffer's
        // bound is the memory TLS adds to a connection.
        if !self.push()? {
            return Err(ErrorKind::WouldBlock.into());
        }
        let n = self.tls.writer().write(buf)?;
        if n == 0 {
            return Err(ErrorKind::WouldBlock.into());
        }
        self.push()?;
        Ok(n)
    }

    /// Writes queued TLS records to the socket: true when none is left.
    fn push(&mut self) -> io::Result<bool> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

impl Source for Conn {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        self.tcp().register(r, t, i)
    }
    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        self.tcp().reregister(r, t, i)
    }
    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        self.tcp().deregister(r)
    }
}

/// The TLS server configuration of `tls-cert-file`, `tls-key-file`,
/// `tls-ca-cert-file` and `tls-auth-clients`. Every error names the file and
/// what is wrong with it.
pub fn server_config(c: &Config) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    if c.tls_cert_file.is_empty() || c.tls_key_file.is_empty() {
        return Err(
            "tls-port needs tls-cert-file and tls-key-file (the server's certificate and its private key, PEM)"
                .into(),
        );
    }
    let certs = read_certs("tls-cert-file", &c.tls_cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&c.tls_key_file).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => format!(
            "tls-key-file {}: no PEM private key in the file",
            c.tls_key_file
        ),
        e => format!("cannot read tls-key-file {}: {e}", c.tls_key_file),
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match c.tls_auth_clients {
        TlsAuth::No => builder.with_no_client_auth(),
        auth => {
            if c.tls_ca_cert_file.is_empty() {
                return Err(format!(
                    "tls-auth-clients {} needs tls-ca-cert-file (the CA that signs client certificates; or set tls-auth-clients no)",
                    auth.name()
                ));
            }
            let mut roots = RootCertStore::empty();
            for cert in read_certs("tls-ca-cert-file", &c.tls_ca_cert_file)? {
                roots.add(cert).map_err(|e| {
                    format!(
                        "tls-ca-cert-file {}: not a usable CA certificate: {e}",
                        c.tls_ca_cert_file
                    )
                })?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if auth == TlsAuth::Optional {
                v.allow_unauthenticated()
            } else {
                v
            };
            let v = v.build().map_err(|e| {
                format!(
                    "tls-ca-cert-file {}: cannot verify clients with it: {e}",
                    c.tls_ca_cert_file
                )
            })?;
            builder.with_client_cert_verifier(v)
        }
    };
    let cfg = builder.with_single_cert(certs, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "tls-key-file {} is not the private key of the certificate in tls-cert-file {}",
            c.tls_key_file, c.tls_cert_file
        ),
        e => format!(
            "tls-cert-file {} with tls-key-file {}: {e}",
            c.tls_cert_file, c.tls_key_file
        ),
    })?;
    Ok(Arc::new(cfg))
}

/// The certificates of a PEM file (at least one).
fn read_certs(param: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {param} {path}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read {param} {path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{param} {path}: no PEM certificate in the file"));
    }
    Ok(certs)
}
