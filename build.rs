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

    // The o200k_base table the token counter is built from (`src/render/tokens.rs`): the
    // daemon embeds this copy so that it can release the table's pages once its tokenizer is
    // built, and keeps only what counting reads.
    std::fs::write(out_dir.join("o200k_base.bpe"), counting_table()?)?;

    // tonic's own rerun lines cover the proto files; sqlx::migrate!() embeds migrations/.
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=migrations");
    Ok(())
}

/// bpe-openai's `o200k_base` table (a `bpe::BytePairEncoding`, which MessagePack writes as an
/// array of its fields in declaration order) without the fields that counting never reads:
/// counting (`BacktrackEncoder`) walks the longest-match automaton, the token starts, the
/// split table, the pair lookup and the next-prefix table; the token bytes, the hash map from
/// bytes to token and the two overlapping-match automata serve encoding and decoding. They are
/// 17.6 of the table's 32.2 MB and about 20 MB once deserialized. `render::tokens`'s tests
/// check that counts equal bpe-openai's own.
fn counting_table() -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    use rmpv::Value;
    const FIELDS: usize = 10;
    const ALL_TOKENS: usize = 0;
    const BYTES_HASH_TO_TOKEN: usize = 2;
    const OVERLAPPING_SEARCHERS: [usize; 2] = [6, 7];

    let full = rmp_serde::to_vec(&bpe_openai::o200k_base().bpe)?;
    let Value::Array(mut fields) = rmpv::decode::read_value(&mut full.as_slice())? else {
        return Err("bpe's BytePairEncoding no longer serializes as an array".into());
    };
    if fields.len() != FIELDS {
        return Err(format!("bpe's BytePairEncoding has {} fields, not {FIELDS}", fields.len()).into());
    }
    fields[ALL_TOKENS] = Value::Array(Vec::new());
    fields[BYTES_HASH_TO_TOKEN] = Value::Map(Vec::new());
    // The smallest automaton daachorse builds: one pattern no UTF-8 text contains.
    let unused = aneubeck_daachorse::DoubleArrayAhoCorasick::<u32>::with_values([(&[0xff_u8; 4][..], 0)])
        .map_err(|e| format!("daachorse: {e}"))?;
    for i in OVERLAPPING_SEARCHERS {
        fields[i] = Value::Binary(unused.serialize());
    }
    let mut table = Vec::new();
    rmpv::encode::write_value(&mut table, &Value::Array(fields))?;
    Ok(table)
}
