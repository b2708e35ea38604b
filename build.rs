//! Compiles `proto/` with a vendored protoc, so a fresh machine needs nothing installed,
//! writes the file descriptor set that server reflection serves, and the token counter's
//! table.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment here.
    unsafe { env::set_var("PROTOC", protoc) };

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // A request that does not decode is INVALID_ARGUMENT, not tonic's INTERNAL (SPEC §6).
        .codec_path("crate::codec::Codec")
        .file_descriptor_set_path(out_dir.join("toolrouter_descriptor.bin"))
        // The server's trait is generated below, apart.
        .build_server(false)
        .compile_protos(&["proto/toolrouter/v1/router.proto"], &["proto"])?;

    // The server's trait: the messages above, except the answers whose tools are written
    // from bytes encoded once per registry (`crate::wire`).
    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::Codec")
        .build_client(false)
        .extern_path(".toolrouter.v1", "crate::proto")
        .extern_path(".toolrouter.v1.RouteResponse", "crate::wire::RouteResponse")
        .extern_path(
            ".toolrouter.v1.ListAllToolsResponse",
            "crate::wire::ListAllToolsResponse",
        )
        .out_dir(&server_dir)
        .compile_protos(&["proto/toolrouter/v1/router.proto"], &["proto"])?;

    // serde impls following protobuf's canonical JSON mapping (lowerCamelCase names, 64-bit
    // integers as strings, enums by name), for the CLI's `--json`.
    let descriptors = std::fs::read(out_dir.join("toolrouter_descriptor.bin"))?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .build(&[".toolrouter"])?;

    // The o200k_base table the token counter is built from (`src/render/tokens.rs`),
    // serialized from bpe-openai's tokenizer: the daemon embeds this copy so that it can
    // release the table's pages once its tokenizer is built.
    let table = rmp_serde::to_vec(&bpe_openai::o200k_base().bpe)?;
    std::fs::write(out_dir.join("o200k_base.bpe"), table)?;

    // tonic's own rerun lines cover the proto files; sqlx::migrate!() embeds migrations/.
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=migrations");
    Ok(())
}
