//! Compiles the wire protocols in `proto/` with tonic-build, fed by protox
//! (a pure-Rust protobuf compiler), so that no system `protoc` is needed.
//!
//! CSI gets default method stubs: an RPC a server does not implement
//! answers UNIMPLEMENTED, which CSI allows for every RPC behind a
//! capability not advertised. Ballast's own agent protocol does not: a
//! missing RPC there is a compile error.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for (file, stubs) in [
        ("proto/csi/csi.proto", true),
        ("proto/ballast/agent.proto", false),
    ] {
        println!("cargo:rerun-if-changed={file}");
        let fds = protox::compile([file], ["proto"])?;
        tonic_prost_build::configure()
            .build_server(true)
            .build_client(true)
            .generate_default_stubs(stubs)
            .compile_fds(fds)?;
    }
    Ok(())
}
