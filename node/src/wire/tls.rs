//! The replica protocol's transport: plain TCP, or mutual TLS with the
//! node's credentials (`ballast::tls`). Both sides get a read half and a
//! write half; the server also learns who the client is. It owns the
//! handshake, and which credentials a client dials with (a fill reads its
//! source with a reader's, `readers`), and nothing of the protocol above.

use std::sync::Arc;

use ballast::tls::{CertSlot, Credentials, Role, TlsError, holds};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The read half of a connection.
pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// The write half of a connection.
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// How replica connections are made and taken: plain TCP (the default) or
/// mutual TLS; and, for an engine, the attachment it claims when it opens
/// a replica.
#[derive(Clone, Default)]
pub struct WireTls {
    sides: Option<Arc<Sides>>,
    /// The volume's attachment this process acts for (an engine's epoch;
    /// 0: none). With TLS on, its certificate names it.
    attachment: u64,
    /// Where a node gets a reader's certificate to read another node's
    /// replica (None: it reads with its own, which opens only replicas of
    /// this node).
    readers: Option<Arc<super::readers::Readers>>,
}

struct Sides {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    /// This node: a client of the server holding its certificate is on
    /// this node.
    me: Role,
    node_id: String,
}

impl std::fmt::Debug for WireTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.sides.is_some() {
            "WireTls(on)"
        } else {
            "WireTls(off)"
        })
    }
}

/// Who a server's client is.
#[derive(Debug)]
pub enum Peer {
    /// A plain connection: nothing is known of the client.
    Plain,
    /// A client of the cluster: whether it is this node, and its
    /// certificates (end entity first), to check what else it is.
    Member {
        this_node: bool,
        certs: Vec<CertificateDer<'static>>,
    },
}

impl Peer {
    /// Whether the peer is of `role`: always, on a plain connection
    /// (nothing can be known; TLS off trusts the network).
    pub fn is(&self, role: &Role) -> bool {
        match self {
            Peer::Plain => true,
            Peer::Member { certs, .. } => holds(certs, role),
        }
    }

    /// Whether the peer may open a replica of `volume`: that volume's
    /// engine, a reader of it (a fill's source), or this node's plugin
    /// (always, on a plain connection). An engine carries its node's names
    /// too, but opens no other volume's replicas there: a pod's engine
    /// taken over reads its own volume only.
    pub fn may_open(&self, volume: &str) -> bool {
        match self {
            Peer::Plain => true,
            Peer::Member { this_node, certs } => {
                holds(certs, &Role::Engine(volume.to_string()))
                    || holds(certs, &Role::Reader(volume.to_string()))
                    || (*this_node && !ballast::tls::is_engine(certs))
            }
        }
    }
}

/// The socket under a TLS session, read ahead: the session asks for 4 KiB
/// more at a time (rustls's deframer), which from the socket itself made
/// 4.3 receives of each 64 KiB frame; from this buffer one receive serves
/// a burst of records (0.33 per frame; data-plane.md). Writes pass
/// through.
fn read_ahead(tcp: TcpStream) -> tokio::io::BufReader<TcpStream> {
    tokio::io::BufReader::with_capacity(super::IO_BUFFER, tcp)
}

/// How much a client's session seals before its records go to the
/// socket: four 64 KiB writes' frames (65,640 bytes each: its header, the
/// data and a crc32c per block), about what the engine queues at once.
const SEAL_AHEAD: usize = {
    const WRITE: usize = 64 << 10;
    const SUMS: usize = WRITE / crate::replica::BLOCK as usize * 4;
    4 * (super::protocol::REQUEST_HEADER + WRITE + SUMS)
};
const _: () = assert!(SEAL_AHEAD == 4 * 65_640);

impl WireTls {
    /// Mutual TLS with `credentials`, those of node `node_id`.
    pub fn new(credentials: &Credentials, node_id: &str) -> Result<WireTls, TlsError> {
        Self::showing(credentials, node_id, CertSlot::of(credentials)?)
    }

    /// The same, showing the certificate in `slot` (the process's gRPC
    /// sides', `Tls::slot`): one renewal reaches both.
    pub fn showing(
        credentials: &Credentials,
        node_id: &str,
        slot: Arc<CertSlot>,
    ) -> Result<WireTls, TlsError> {
        Ok(WireTls {
            attachment: 0,
            readers: None,
            sides: Some(Arc::new(Sides {
                acceptor: TlsAcceptor::from(credentials.rustls_server_in(slot.clone())?),
                connector: TlsConnector::from(credentials.rustls_client_in(slot)?),
                me: Role::Node(node_id.to_string()),
                node_id: node_id.to_string(),
            })),
        })
    }

    /// The same, reading other nodes' replicas with readers' certificates
    /// asked of `readers`.
    pub fn reading_through(mut self, readers: super::readers::Readers) -> WireTls {
        self.readers = Some(Arc::new(readers));
        self
    }

    /// How to dial replica `source` to fill `target`, a replica of this
    /// node: with TLS on and a controller to ask, with a reader's
    /// certificate for the source's volume, made for this fill; else as
    /// this node (over plain TCP, or to a source on this node).
    pub async fn to_read(&self, target: &str, source: &str) -> Result<WireTls, String> {
        let (Some(s), Some(readers)) = (&self.sides, &self.readers) else {
            return Ok(self.clone());
        };
        let credentials = readers.credentials(target, source).await?;
        WireTls::new(&credentials, &s.node_id).map_err(|e| format!("a reader's TLS settings: {e}"))
    }

    /// The same, for an engine started for the volume's attachment
    /// `epoch`: it claims it at every OPEN.
    pub fn for_attachment(mut self, epoch: u64) -> WireTls {
        self.attachment = epoch;
        self
    }

    /// The attachment claimed at every OPEN (0: none).
    pub fn attachment(&self) -> u64 {
        self.attachment
    }

    pub fn is_on(&self) -> bool {
        self.sides.is_some()
    }

    /// The client side of a new connection: the server must show a node's
    /// certificate of the cluster.
    pub async fn connect(&self, tcp: TcpStream) -> std::io::Result<(Reader, Writer)> {
        let _ = tcp.set_nodelay(true);
        let Some(s) = &self.sides else {
            let (r, w) = tcp.into_split();
            return Ok((Box::new(r), Box::new(w)));
        };
        let name = ServerName::try_from(Role::AnyNode.name())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let mut stream = s.connector.connect(name, read_ahead(tcp)).await?;
        // Seal a whole batch of frames before writing the socket, not 64
        // KiB (rustls's default) at a time.
        stream.get_mut().1.set_buffer_limit(Some(SEAL_AHEAD));
        let (r, w) = tokio::io::split(stream);
        Ok((Box::new(r), Box::new(w)))
    }

    /// The server side of a new connection: a client without a certificate
    /// of the cluster fails the handshake, before any request is read.
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<(Reader, Writer, Peer)> {
        let _ = tcp.set_nodelay(true);
        let Some(s) = &self.sides else {
            let (r, w) = tcp.into_split();
            return Ok((Box::new(r), Box::new(w), Peer::Plain));
        };
        let stream = s.acceptor.accept(read_ahead(tcp)).await?;
        let certs: Vec<CertificateDer<'static>> = {
            let (_, session) = stream.get_ref();
            session
                .peer_certificates()
                .unwrap_or_default()
                .iter()
                .map(|c| c.clone().into_owned())
                .collect()
        };
        let this_node = holds(&certs, &s.me);
        let (r, w) = tokio::io::split(stream);
        Ok((Box::new(r), Box::new(w), Peer::Member { this_node, certs }))
    }
}
