fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "proto/ferry/v1/common.proto",
        "proto/ferry/v1/messaging.proto",
        "proto/ferry/v1/admin.proto",
        "proto/ferry/v1/backend.proto",
        "proto/ferry/v1/cluster.proto",
        "proto/ferry/v1/node.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    // `prost::Name` on every message, so the codec can name the type a body failed to decode as.
    let mut prost_config = tonic_prost_build::Config::new();
    prost_config.enable_type_names();
    tonic_prost_build::configure()
        // Undecodable requests are the caller's mistake (INVALID_ARGUMENT), not tonic-prost's
        // INTERNAL: see src/codec.rs.
        .codec_path("crate::codec::FerryCodec")
        // Delivered bodies are shared with the queue's copy (a reference count, not a copy).
        .bytes(".ferry.v1.Message.body")
        // A sent body is a view of the received buffer until the back-end takes its own copy, so the
        // front-end can hold a request for a retry without copying it.
        .bytes(".ferry.v1.OutgoingMessage.body")
        // Raft batches are handed to the engine's thread without a copy.
        .bytes(".ferry.v1.RaftBatch.batch")
        .bytes(".ferry.v1.SnapshotChunk.data")
        .bytes(".ferry.v1.SnapshotChunk.shard_ops")
        .file_descriptor_set_path(out_dir.join("ferry_v1_descriptor.bin"))
        .compile_with_config(prost_config, &protos, &["proto"])?;
    Ok(())
}
