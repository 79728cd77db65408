//! Reading a payload of known length from a buffered socket without
//! zero-filling a buffer first and, for large payloads, without copying
//! through the read buffer: what is buffered is taken, the rest is read
//! from the socket straight into the payload.

use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, BufReader};

/// Reads exactly `n` bytes.
pub async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    n: usize,
) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(n);
    let buffered = rd.buffer();
    let have = buffered.len().min(n);
    v.extend_from_slice(&buffered[..have]);
    std::pin::Pin::new(&mut *rd).consume(have);
    if v.len() < n {
        let rest = (n - v.len()) as u64;
        rd.get_mut().take(rest).read_to_end(&mut v).await?;
    }
    if v.len() != n {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("payload of {n} bytes cut off at {}", v.len()),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn payloads_come_whole_across_the_buffer_and_the_socket() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut rd = BufReader::with_capacity(1000, &bytes[..]);
        let mut head = [0u8; 10];
        rd.read_exact(&mut head).await.unwrap();
        let a = read_payload(&mut rd, 50_000).await.unwrap();
        assert_eq!(a, bytes[10..50_010]);
        let b = read_payload(&mut rd, 10).await.unwrap();
        assert_eq!(b, bytes[50_010..50_020]);
        let c = read_payload(&mut rd, 49_980).await.unwrap();
        assert_eq!(c, bytes[50_020..]);
        assert!(read_payload(&mut rd, 1).await.is_err());
    }
}
