//! Compiles `proto/` into Rust with protox (a pure-Rust protobuf compiler) and tonic-prost-build,
//! and derives the JSON mapping of every message with pbjson-build.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: two checkouts sharing a
    // target directory share the compiled script.
    let root =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR unset")?)
            .join("../../proto");
    let files = [
        "etcd/api/mvccpb/kv.proto",
        "etcd/api/authpb/auth.proto",
        "etcd/api/etcdserverpb/rpc.proto",
        "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
        "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
        "etcd/server/lease/leasepb/lease.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let descriptors = protox::compile(files, [&root])?;
    let encoded = prost::Message::encode_to_vec(&descriptors);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("schema.rs"), schema(&descriptors))?;
    // Type names (`prost::Name`): the gateway finds a request's schema by its message name.
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds_with_config(descriptors, config)?;
    // Serde impls following protobuf's JSON mapping with the options etcd's gateway uses:
    // proto field names out (`create_revision`, `ID`), either name in, unknown fields ignored.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[
            ".mvccpb",
            ".authpb",
            ".etcdserverpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    Ok(())
}

/// Every message's fields as `api::schema` describes them: a static table, sorted by the
/// message's full name.
fn schema(fds: &prost_types::FileDescriptorSet) -> String {
    use prost_types::field_descriptor_proto::{Label, Type};
    fn enums(prefix: &str, es: &[prost_types::EnumDescriptorProto], out: &mut Vec<String>) {
        for e in es {
            let names: Vec<String> = e
                .value
                .iter()
                .map(|v| format!("({:?}, {})", v.name(), v.number()))
                .collect();
            out.push(format!(
                "({:?}, &[{}]),\n",
                format!("{prefix}.{}", e.name()),
                names.join(", ")
            ));
        }
    }
    fn walk(
        prefix: &str,
        msgs: &[prost_types::DescriptorProto],
        out: &mut Vec<(String, String)>,
        all_enums: &mut Vec<String>,
    ) {
        for m in msgs {
            let full = format!("{prefix}.{}", m.name());
            enums(&full, &m.enum_type, all_enums);
            let mut fields = String::new();
            for f in &m.field {
                let kind = match f.r#type() {
                    Type::Bool => "Bool",
                    Type::Int32 | Type::Sint32 | Type::Sfixed32 => "Int32",
                    Type::Int64 | Type::Sint64 | Type::Sfixed64 => "Int64",
                    Type::Uint32 | Type::Fixed32 => "Uint32",
                    Type::Uint64 | Type::Fixed64 => "Uint64",
                    Type::Float => "Float",
                    Type::Double => "Double",
                    Type::String => "String",
                    Type::Bytes => "Bytes",
                    Type::Enum => "Enum",
                    Type::Message | Type::Group => "Message",
                };
                let json = if f.json_name().is_empty() {
                    f.name().to_owned()
                } else {
                    f.json_name().to_owned()
                };
                let oneof = match f.oneof_index {
                    Some(i) if !f.proto3_optional() => {
                        format!("Some({:?})", m.oneof_decl[i as usize].name())
                    }
                    _ => "None".to_owned(),
                };
                fields.push_str(&format!(
                    "Field {{ name: {:?}, json_name: {:?}, kind: Kind::{kind}, repeated: {}, type_name: {:?}, oneof: {oneof} }},\n",
                    f.name(),
                    json,
                    f.label() == Label::Repeated,
                    f.type_name(),
                ));
            }
            out.push((full.clone(), fields));
            walk(&full, &m.nested_type, out, all_enums);
        }
    }
    let mut all = Vec::new();
    let mut all_enums = Vec::new();
    for file in &fds.file {
        let package = format!(".{}", file.package());
        enums(&package, &file.enum_type, &mut all_enums);
        walk(&package, &file.message_type, &mut all, &mut all_enums);
    }
    all.sort();
    all_enums.sort();
    let mut s = String::from("pub static MESSAGES: &[(&str, &[Field])] = &[\n");
    for (name, fields) in all {
        s.push_str(&format!("({name:?}, &[\n{fields}]),\n"));
    }
    s.push_str("];\n");
    s.push_str("pub static ENUMS: &[(&str, &[(&str, i32)])] = &[\n");
    for e in all_enums {
        s.push_str(&e);
    }
    s.push_str("];\n");
    // Every gRPC method: service (package-qualified), method, and grpc-go's type label.
    s.push_str("pub static METHODS: &[(&str, &str, &str)] = &[\n");
    for file in &fds.file {
        for svc in &file.service {
            for m in &svc.method {
                let kind = match (m.client_streaming(), m.server_streaming()) {
                    (false, false) => "unary",
                    (false, true) => "server_stream",
                    (true, false) => "client_stream",
                    (true, true) => "bidi_stream",
                };
                s.push_str(&format!(
                    "({:?}, {:?}, {kind:?}),\n",
                    format!("{}.{}", file.package(), svc.name()),
                    m.name()
                ));
            }
        }
    }
    s.push_str("];\n");
    s
}
