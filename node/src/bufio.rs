//! Reading framed messages from a socket: headers are copied out of a read
//! buffer, and payloads are split off it as shared `Bytes`, so a payload's
//! bytes are copied once, from the kernel into the buffer, and never again
//! (a `BufReader` would copy them a second time into the payload). Reads
//! keep what they got in the buffer, so a read dropped half way (in a
//! `select!`) loses nothing.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    /// How much to ask the socket for at a time, at least.
    chunk: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, chunk: usize) -> Self {
        FrameReader {
            inner,
            buf: BytesMut::with_capacity(chunk),
            chunk,
        }
    }

    /// Bytes read from the socket and not yet taken.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Reads until at least `n` bytes are buffered.
    async fn fill(&mut self, n: usize) -> std::io::Result<()> {
        while self.buf.len() < n {
            let want = (n - self.buf.len()).max(self.chunk);
            if self.buf.capacity() - self.buf.len() < want {
                self.buf.reserve(want);
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the stream ended with {} of {n} bytes", self.buf.len()),
                ));
            }
        }
        Ok(())
    }

    /// Fills `out` (a header).
    pub async fn read_exact(&mut self, out: &mut [u8]) -> std::io::Result<()> {
        self.fill(out.len()).await?;
        let head = self.buf.split_to(out.len());
        out.copy_from_slice(&head);
        Ok(())
    }

    /// The next `n` bytes (a payload), without copying them.
    pub async fn payload(&mut self, n: usize) -> std::io::Result<Bytes> {
        if n == 0 {
            return Ok(Bytes::new());
        }
        self.fill(n).await?;
        Ok(self.buf.split_to(n).freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn headers_and_payloads_come_whole_whatever_the_chunk() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        for chunk in [1, 7, 1000, 64 * 1024] {
            let mut rd = FrameReader::new(&bytes[..], chunk);
            let mut head = [0u8; 10];
            rd.read_exact(&mut head).await.unwrap();
            assert_eq!(head[..], bytes[..10]);
            let a = rd.payload(50_000).await.unwrap();
            assert_eq!(a[..], bytes[10..50_010]);
            let b = rd.payload(10).await.unwrap();
            assert_eq!(b[..], bytes[50_010..50_020]);
            assert!(rd.payload(0).await.unwrap().is_empty());
            let c = rd.payload(49_980).await.unwrap();
            assert_eq!(c[..], bytes[50_020..]);
            assert_eq!(rd.buffered(), 0);
            let e = rd.payload(1).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        }
    }
}
