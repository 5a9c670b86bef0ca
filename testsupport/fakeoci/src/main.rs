//! `fakeoci`: runs the fake Object Storage by hand or for a script. Prints one JSON line (endpoint,
//! namespace, keyId, tenancy, user, fingerprint, admin, and the InstancePrincipal's metadata and
//! federation bases), then serves until killed.
//!
//! ```text
//! fakeoci [--port P] [--namespace NS] [--page-size N] [--public-key PEM_FILE] [--tenancy OCID] [--user OCID]
//!         [--dir BUCKET:PREFIX=DIR]... [--generated BUCKET:NAME=SIZE_BYTES]...
//!         [--multipart BUCKET:NAME=SIZE_BYTES:PARTS[:meta]]...
//! ```
//! Without `--public-key` it accepts the crate's test key (`keys/test-key.pem`). Without an object option
//! it serves a demo bucket `models` under `demo/` (a config, a whole object, a multipart one with
//! `opc-meta-md5`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use model_agent_fakeoci::{BucketFixture, Config, FakeOci, Fixtures, ObjectFixture};

#[derive(Default)]
struct Args {
    config: Config,
    buckets: BTreeMap<String, BucketFixture>,
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1).collect()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("fakeoci: {message}\nusage: see the doc comment of testsupport/fakeoci/src/main.rs");
            return ExitCode::from(2);
        }
    };
    let fixtures = fixtures(args.buckets);
    let oci = match FakeOci::start_with(fixtures, args.config.clone()) {
        Ok(oci) => oci,
        Err(error) => {
            eprintln!("fakeoci: {error}");
            return ExitCode::FAILURE;
        }
    };
    let line = serde_json::json!({
        "endpoint": oci.endpoint(), "namespace": oci.namespace(), "key_id": oci.key_id(),
        "tenancy": args.config.tenancy, "user": args.config.user, "fingerprint": oci.fingerprint(),
        "admin": format!("{}/_fakeoci", oci.endpoint()),
        "metadata": oci.metadata_base_url(), "federation": oci.federation_base_url(),
    });
    println!("{line}");
    loop {
        std::thread::park();
    }
}

fn fixtures(mut buckets: BTreeMap<String, BucketFixture>) -> Fixtures {
    if buckets.is_empty() {
        let demo = BucketFixture::new("models")
            .object(ObjectFixture::inline("demo/config.json", "{\"model_type\": \"demo\"}\n"))
            .object(ObjectFixture::generated("demo/model-00001.safetensors", 3 << 20, 1))
            .object(ObjectFixture::generated("demo/model-00002.safetensors", 5 << 20, 2).multipart(3).with_meta_md5());
        buckets.insert("models".into(), demo);
    }
    buckets.into_values().fold(Fixtures::new(), Fixtures::bucket)
}

/// `BUCKET:REST` → (bucket, rest).
fn split_bucket<'a>(flag: &str, value: &'a str) -> Result<(&'a str, &'a str), String> {
    value.split_once(':').ok_or_else(|| format!("{flag} wants BUCKET:…"))
}

/// Distinct names, distinct bytes; the same name, the same bytes on every run.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn add_object(args: &mut Args, flag: &str, value: &str) -> Result<(), String> {
    let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
    let (bucket, rest) = split_bucket(flag, value)?;
    let (name, spec) = rest.rsplit_once('=').ok_or_else(|| format!("{flag} wants BUCKET:NAME=…"))?;
    let mut spec = spec.split(':');
    let size = number(spec.next().unwrap_or(""))?;
    let mut object = ObjectFixture::generated(name, size, seed_of(name));
    if flag == "--multipart" {
        let parts = number(spec.next().ok_or("--multipart wants SIZE_BYTES:PARTS")?)?;
        object = object.multipart(u32::try_from(parts).map_err(|e| e.to_string())?);
        if spec.next() == Some("meta") {
            object = object.with_meta_md5();
        }
    }
    let fixture = args.buckets.remove(bucket).unwrap_or_else(|| BucketFixture::new(bucket));
    args.buckets.insert(bucket.to_owned(), fixture.object(object));
    Ok(())
}

fn parse(raw: Vec<String>) -> Result<Args, String> {
    let mut args = Args::default();
    let mut iter = raw.into_iter();
    while let Some(flag) = iter.next() {
        let value = iter.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--port" => args.config.port = number(&value)? as u16,
            "--page-size" => args.config.list_page_size = number(&value)? as usize,
            "--namespace" => args.config.namespace = value,
            "--tenancy" => args.config.tenancy = value,
            "--user" => args.config.user = value,
            "--public-key" => {
                args.config.public_key_pem = std::fs::read_to_string(&value).map_err(|e| format!("{value}: {e}"))?;
            }
            "--dir" => {
                let (bucket, rest) = split_bucket(&flag, &value)?;
                let (prefix, dir) = rest.split_once('=').ok_or("--dir wants BUCKET:PREFIX=DIR")?;
                let fixture = args.buckets.remove(bucket).unwrap_or_else(|| BucketFixture::new(bucket));
                let fixture = fixture.from_dir(prefix, &PathBuf::from(dir)).map_err(|e| format!("{dir}: {e}"))?;
                args.buckets.insert(bucket.to_owned(), fixture);
            }
            "--generated" | "--multipart" => add_object(&mut args, &flag, &value)?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(args)
}
