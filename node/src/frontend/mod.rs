//! How an engine is exposed: an NBD server on a unix socket (any NBD
//! client can use it: qemu-io, qemu-img, nbd-client), a kernel block
//! device (a FUSE file with a loop device on it), and the control socket
//! through which the node agent manages the running engine. Each sits on
//! the engine and on nothing above it.

pub mod blockdev;
pub mod control;
pub mod fuse;
pub mod nbd;
