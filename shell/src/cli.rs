//! The agent's flags (clap). Every flag and env variable OME's agent takes is accepted, the ones
//! that mean nothing here included (`--node-name`, `--node-label-retry`, `--download-retry`), so
//! that OME's DaemonSet argument list runs as is. The `inspect` and `download` subcommands parse
//! their own words (`main`).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Parser;

use model_agent_core::machine::WriteCheck;

/// `--concurrency` and `--multipart-concurrency` at most (open connections per model).
pub const CONCURRENCY_MAX: usize = 64;

const SUBCOMMANDS_AND_ENV: &str = "\
Subcommands (the first word):
  model-agent inspect DIR [--annotations k=v ...]
      print the metadata `config` the agent would publish for DIR and the spec fields it would
      fill, as JSON
  model-agent download --models-root-dir ROOT --dest REL [--uid U] [--concurrency N]
                       [--multipart-concurrency N] [--multipart-threshold BYTES]
                       [--ca-bundle FILE] [--param K=V ...] URI
      download one model into ROOT/REL: hf://org/repo[@rev] (endpoint from HF_ENDPOINT, else
      ENDPOINT; token from HF_TOKEN), or oci://, s3://, gs://, az:// (--param endpoint=...,
      region=...; credentials from each cloud's environment); progress on stderr, a JSON line
      {commit, files, bytes_total, bytes_fetched, seconds} on stdout

Environment:
  NODE_NAME (required); HF_ENDPOINT, else ENDPOINT (https://huggingface.co); HF_TOKEN (the last
  resort for a Hub token, after the model's Secret and parameters.token); INSTANCE_TYPE_MAP (JSON
  instance type -> GPU name, for TensorRT-LLM models; invalid JSON stops the start); downloads go
  through HTTPS_PROXY, HTTP_PROXY, ALL_PROXY except NO_PROXY (as curl reads them), and trust
  SSL_CERT_FILE or SSL_CERT_DIR instead of the system's roots when set";

/// model-agent: makes LLM model weights available on this node and reports them (OME-compatible)
#[derive(Debug, Parser)]
#[command(name = "model-agent", version, after_help = SUBCOMMANDS_AND_ENV)]
pub struct Cli {
    /// Health and metrics port
    #[arg(long, default_value_t = 8080, help_heading = "Health and metrics")]
    pub port: u16,
    /// Address the health and metrics server binds (0.0.0.0: every address; 127.0.0.1 keeps
    /// /metrics, which names models, on the node)
    #[arg(long = "metrics-bind-address", default_value = "0.0.0.0", value_parser = bind_address, help_heading = "Health and metrics")]
    pub bind_address: IpAddr,

    /// Models root on the node
    #[arg(long = "models-root-dir", default_value = "/mnt/models", value_parser = absolute, help_heading = "Node and cluster")]
    pub models_root: String,
    /// Namespace of the per-node ConfigMap
    #[arg(long, default_value = "ome", help_heading = "Node and cluster")]
    pub namespace: String,
    /// auto | always | never (auto: only when a ClusterBaseModel placed here downloads)
    #[arg(long = "models-root-write-check", default_value = "auto", value_parser = write_check, help_heading = "Node and cluster")]
    pub write_check: WriteCheck,
    /// Kubeconfig (default: in-cluster, or $KUBECONFIG)
    #[arg(long, help_heading = "Node and cluster")]
    pub kubeconfig: Option<String>,
    /// How often the agent compares what the node shows (labels, ConfigMap entries, directories
    /// under the models root) with what it believes, and repairs the difference (at least 60000)
    #[arg(long = "drift-period-ms", default_value_t = 300_000, value_parser = drift_period, help_heading = "Node and cluster")]
    pub drift_period_ms: u64,
    /// Fill a Ready model's empty spec metadata fields from its config files (needs
    /// deploy/components/update-model-spec)
    #[arg(long = "update-model-spec", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = clap::value_parser!(bool), help_heading = "Node and cluster")]
    pub update_model_spec: bool,

    /// Models fetched at once
    #[arg(long = "num-download-worker", default_value_t = 5, help_heading = "Downloads")]
    pub fetch_workers: usize,
    /// Files at once per downloading model (at most 64)
    #[arg(long = "concurrency", default_value_t = 4, value_parser = concurrency, help_heading = "Downloads")]
    pub files_concurrency: usize,
    /// Ranged parts (or chunks of an object) at once per file of --multipart-threshold or more (at most 64)
    #[arg(long = "multipart-concurrency", default_value_t = 4, value_parser = concurrency, help_heading = "Downloads")]
    pub multipart_concurrency: usize,
    /// Files this large or larger download in ranged parts
    #[arg(long = "multipart-threshold", default_value_t = 200 << 20, value_parser = positive::<u64>, help_heading = "Downloads")]
    pub multipart_threshold_bytes: u64,
    /// How often a download's progress goes into its entry (OME's 30 s)
    #[arg(long = "download-progress-period-ms", default_value_t = 30_000, value_parser = positive::<u64>, help_heading = "Downloads")]
    pub progress_period_ms: u64,
    /// PEM certificates trusted for downloads beside the system's roots
    #[arg(long = "ca-bundle", help_heading = "Downloads")]
    pub ca_bundle: Option<PathBuf>,

    /// error | warn | info | debug | trace, or a tracing filter
    #[arg(long = "log-level", env = "LOG_LEVEL", default_value = "info", help_heading = "Logs and traces")]
    pub log_level: String,
    /// text | json
    #[arg(long = "log-format", default_value = "text", value_parser = ["text", "json"], help_heading = "Logs and traces")]
    pub log_format: String,
    /// Record every core input and its effects as JSON lines
    #[arg(long = "record-trace", help_heading = "Logs and traces")]
    pub record_trace: Option<PathBuf>,

    /// Accepted for OME compatibility: the core retries label writes with backoff
    #[arg(long = "node-label-retry", help_heading = "Accepted for OME compatibility")]
    pub node_label_retry: Option<u64>,
    /// Accepted for OME compatibility: the core retries downloads with backoff, without a limit
    #[arg(long = "download-retry", help_heading = "Accepted for OME compatibility")]
    pub download_retry: Option<u64>,
    /// Accepted for OME compatibility and ignored: the node is NODE_NAME, as in OME
    #[arg(long = "node-name", help_heading = "Accepted for OME compatibility")]
    pub node_name: Option<String>,
}

impl Cli {
    pub fn log_json(&self) -> bool {
        self.log_format == "json"
    }
}

fn bind_address(v: &str) -> Result<IpAddr, String> {
    v.parse().map_err(|_| format!("{v:?} is not an IP address (the port is --port)"))
}

fn absolute(v: &str) -> Result<String, String> {
    match v.starts_with('/') {
        true => Ok(v.to_string()),
        false => Err(format!("must be absolute, not {v:?}")),
    }
}

fn write_check(v: &str) -> Result<WriteCheck, String> {
    v.parse()
}

fn positive<T: std::str::FromStr + PartialOrd + Default>(v: &str) -> Result<T, String> {
    match v.parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => Err(format!("{v:?} is not a positive number")),
    }
}

/// A drift pass answers within 50 s: two API reads of at most 10 s each
/// (`kubeio::LIVE_READ_TIMEOUT`) and a scan of at most 30 s (`fsgate::TRASH_DEADLINE`). A
/// shorter period would replace snapshots before they answer (the core keeps one outstanding),
/// and on a slow root none would ever land. The jitter takes up to a tenth off a period.
pub const DRIFT_PERIOD_MS_MIN: u64 = 60_000;

fn drift_period(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(ms) if ms >= DRIFT_PERIOD_MS_MIN => Ok(ms),
        _ => Err(format!("{v:?} is not a number of milliseconds of at least {DRIFT_PERIOD_MS_MIN}")),
    }
}

fn concurrency(v: &str) -> Result<usize, String> {
    positive::<usize>(v).map(|n| n.min(CONCURRENCY_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Cli, String> {
        let words = std::iter::once("model-agent").chain(line.split_whitespace());
        Cli::try_parse_from(words).map_err(|e| e.to_string())
    }

    #[test]
    fn ome_s_daemonset_arguments_run_as_they_are() {
        // charts/ome-resources model-agent-daemonset: args, with the chart's hostPath.
        let c =
            Cli::try_parse_from(["model-agent", "--models-root-dir", "/mnt/data/models", "--num-download-worker", "2"])
                .unwrap();
        assert_eq!((c.models_root.as_str(), c.fetch_workers), ("/mnt/data/models", 2));
        // Every flag of OME's main.go, the ones that mean nothing here included.
        let c = parse(
            "--port 9090 --models-root-dir /mnt/data/models --namespace x --node-label-retry 5 \
             --num-download-worker 2 --download-retry 3 --concurrency 4 --multipart-concurrency 4 \
             --node-name ignored --log-level debug",
        )
        .unwrap();
        assert_eq!((c.port, c.namespace.as_str(), c.log_level.as_str()), (9090, "x", "debug"));
    }

    #[test]
    fn defaults_are_ome_s() {
        let c = parse("").unwrap();
        assert_eq!((c.port, c.models_root.as_str(), c.namespace.as_str()), (8080, "/mnt/models", "ome"));
        assert_eq!((c.write_check, c.fetch_workers, c.files_concurrency), (WriteCheck::Auto, 5, 4));
        assert_eq!((c.multipart_threshold_bytes, c.progress_period_ms), (200 << 20, 30_000));
        assert_eq!(c.drift_period_ms, model_agent_core::machine::Config::new("n", "/m").drift_period_ms);
        assert_eq!(c.bind_address.to_string(), "0.0.0.0");
        assert!(!c.update_model_spec && !c.log_json());
    }

    #[test]
    fn switches_values_and_limits() {
        assert!(parse("--update-model-spec --port 1").unwrap().update_model_spec);
        assert!(parse("--update-model-spec=true").unwrap().update_model_spec);
        assert!(!parse("--update-model-spec=false").unwrap().update_model_spec);
        assert!(parse("--update-model-spec=yes").is_err());
        let c = parse("--concurrency 999 --models-root-write-check=never --metrics-bind-address ::1 --log-format json")
            .unwrap();
        assert_eq!((c.files_concurrency, c.write_check), (CONCURRENCY_MAX, WriteCheck::Never));
        assert_eq!(c.bind_address.to_string(), "::1");
        assert!(c.log_json());
        assert_eq!(parse("--drift-period-ms 60000").unwrap().drift_period_ms, 60_000);
    }

    #[test]
    fn a_drift_pass_answers_before_the_next_one_at_the_shortest_period() {
        let answer_ms = 2 * crate::kubeio::LIVE_READ_TIMEOUT.as_millis() + crate::fsgate::TRASH_DEADLINE.as_millis();
        // The core takes up to a tenth off a period (jitter).
        let soonest_ms = u128::from(DRIFT_PERIOD_MS_MIN - DRIFT_PERIOD_MS_MIN / 10);
        assert!(answer_ms < soonest_ms, "a pass may take {answer_ms} ms, the next comes after {soonest_ms} ms");
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        let error = |line: &str| parse(line).unwrap_err();
        assert!(error("--models-root-write-check maybe").contains("auto, always or never"));
        assert!(error("--port").contains("a value is required"));
        assert!(error("--bogus 1").contains("unexpected argument"));
        assert!(error("--models-root-dir relative").contains("absolute"));
        assert!(error("--log-format xml").contains("text"));
        assert!(error("--metrics-bind-address :8080").contains("the port is --port"));
        assert!(error("--multipart-threshold 0").contains("positive"));
        assert!(error("--drift-period-ms 59999").contains("at least 60000"));
        assert!(error("--drift-period-ms soon").contains("at least 60000"));
        assert!(error("inspect /m").contains("unexpected argument"), "a subcommand only as the first word");
    }

    #[test]
    fn help_is_grouped_by_topic_and_names_the_subcommands() {
        let help = Cli::try_parse_from(["model-agent", "--help"]).unwrap_err().to_string();
        for heading in [
            "Health and metrics:",
            "Node and cluster:",
            "Downloads:",
            "Logs and traces:",
            "Accepted for OME compatibility:",
        ] {
            assert!(help.contains(heading), "{heading} missing from\n{help}");
        }
        assert!(help.contains("model-agent inspect DIR") && help.contains("NODE_NAME (required)"));
        let version = Cli::try_parse_from(["model-agent", "--version"]).unwrap_err().to_string();
        assert_eq!(version.trim(), format!("model-agent {}", env!("CARGO_PKG_VERSION")));
    }
}
