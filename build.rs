//! Compiles the wire protocols in `proto/` with tonic-build, fed by protox
//! (a pure-Rust protobuf compiler), so that no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/csi/csi.proto", "proto/ballast/agent.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // An RPC a server does not implement answers UNIMPLEMENTED; CSI
        // allows that for every RPC behind a capability not advertised.
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
