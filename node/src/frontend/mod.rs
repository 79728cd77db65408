//! How an engine is exposed: an NBD server on a unix socket (any NBD
//! client can use it: qemu-io, qemu-img, nbd-client). The kernel block
//! device on top of it (FUSE file + loop device) comes next.

pub mod nbd;
