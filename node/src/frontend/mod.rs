//! How an engine is exposed: an NBD server on a unix socket (any NBD
//! client can use it: qemu-io, qemu-img, nbd-client), and a kernel block
//! device (a FUSE file with a loop device on it).

pub mod blockdev;
pub mod fuse;
pub mod nbd;
