//! Exposes eplb's Prometheus metrics on loopback while a simulated 8-rank cluster serves the
//! demo trace: 8 rank threads, each a `Controller` built from an `eplb_config` over the host
//! transport (`eplb_sim::cluster`), with its own planner thread, registering into one registry
//! under the label `rank`.
//!
//! ```text
//! cargo run -p eplb-sim --example serve_metrics -- [--port 9464] [--trace data/esft_chain.json]
//!     [--pace-ms 10] [--passes 40] [--heat-interval 16] [--algo-interval 2] [--policy flashlb]
//!     [--per-layer] [--record FILE] [--no-faults] [--exit] [--dump FILE]
//! ```
//!
//! `GET /metrics` answers in the Prometheus text format 0.0.4 (OpenMetrics when the scraper asks
//! for `application/openmetrics-text`). So that every metric moves, the example also injects
//! faults unless `--no-faults`: layer 3's exchange fails on rank 5 from 5 s to 10 s of every 30 s
//! (`eplb_layers_aborted_total`), one collective in 400 fails
//! (`eplb_collectives_failed_total`), and three in a row every 1500 suspend balancing
//! (`eplb_health{state="suspended"}`) until the ranks resume it 50 forwards later, and rank 3's
//! policy fails one plan in 10 (`eplb_plans_failed_total`) and returns another plan than its
//! peers' in another one in 10 (`eplb_digest_mismatches_total`). With `--exit`
//! it stops when the trace passes are done; otherwise it keeps serving the final values until
//! interrupted. `--record FILE` also records rank 0's heat (`eplb_heat_record_path`);
//! `--dump FILE` scrapes the example's own `/metrics` once the run is done and writes the body
//! there (the gate lints it with `promtool check metrics`).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use eplb_core::Shape;
use eplb_policies::{Error as PolicyError, Input, Policy, PolicyKind};
use eplb_runtime::config::EplbConfig;
use eplb_runtime::metrics::{
    OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, encode_openmetrics, encode_text,
};
use eplb_runtime::policies::policy_for;
use eplb_runtime::startup::ModelInfo;
use eplb_runtime::transfer::RankPlan;
use eplb_runtime::transport::host::{Fault, HostTransport};
use eplb_runtime::transport::{Op, Site, Transport, TransportError};
use eplb_sim::cluster::{Cluster, ClusterSpec};
use eplb_sim::cost::CostSpec;
use eplb_sim::replay::Replay;
use prometheus_client::registry::Registry;

/// The configured policy, except that on the rank it is given to, call `k` fails when
/// `k % 10 == 4` (a failed plan: every rank abandons the cycle) and moves one expert copy when
/// `k % 10 == 8` (another plan than its peers': a digest mismatch, every rank abandons the
/// cycle and restarts the policy state).
struct Flaky {
    inner: Box<dyn Policy + Send>,
    calls: u64,
}

impl Policy for Flaky {
    fn kind(&self) -> PolicyKind {
        self.inner.kind()
    }
    fn scratch_len(&self, shape: &Shape) -> usize {
        self.inner.scratch_len(shape)
    }
    fn state_len(&self, shape: &Shape) -> usize {
        self.inner.state_len(shape)
    }
    fn check_shape(&self, shape: &Shape) -> Result<(), PolicyError> {
        self.inner.check_shape(shape)
    }
    fn colocates(&self) -> bool {
        self.inner.colocates()
    }
    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), PolicyError> {
        let k = self.calls;
        self.calls += 1;
        if k % 10 == 4 {
            return Err(PolicyError::NoPlacement {
                layer: 0,
                why: "injected failure (serve_metrics)",
            });
        }
        self.inner.place(input, scratch, state, out)?;
        if k % 10 == 8 {
            // Swap two slots of layer 0 across ranks 0 and 1: still a valid placement.
            let s = input.current().shape().slots_per_rank();
            if out.len() > s {
                out.swap(0, s);
            }
        }
        Ok(())
    }
}

/// The host transport whose `k`-th collective fails (on every rank alike: every rank asks for
/// the same collectives in the same order) when `fails(k)`.
struct Outages {
    inner: HostTransport,
    collectives: u64,
    faults: bool,
}

impl Outages {
    fn next_fails(&mut self) -> Option<TransportError> {
        let k = self.collectives;
        self.collectives += 1;
        let fails = self.faults && (k % 400 == 150 || (700..703).contains(&(k % 1500)));
        fails.then(|| TransportError::Failed {
            at: Site::new(Op::AllGather, self.inner.rank()),
            code: 1,
            detail: format!("injected outage (collective {k})"),
        })
    }
}

impl Transport for Outages {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    fn all_gather(&mut self, local: &[u64], out: &mut [u64]) -> Result<(), TransportError> {
        match self.next_fails() {
            Some(e) => Err(e),
            None => self.inner.all_gather(local, out),
        }
    }
    fn all_agree(&mut self, flag: bool) -> Result<bool, TransportError> {
        match self.next_fails() {
            Some(e) => Err(e),
            None => self.inner.all_agree(flag),
        }
    }
    fn atomic_collectives(&self) -> bool {
        self.inner.atomic_collectives()
    }
    fn launch(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.inner.launch(plan)
    }
    fn launch_sends(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.inner.launch_sends(plan)
    }
    fn wait(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.inner.wait(plan)
    }
    fn commit(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.inner.commit(plan)
    }
    fn abort(&mut self, plan: &RankPlan) {
        self.inner.abort(plan)
    }
}

fn serve(listener: TcpListener, registry: Arc<Registry>) {
    for stream in listener.incoming().flatten() {
        let _ = answer(stream, &registry);
    }
}

fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let mut openmetrics = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("accept:") && lower.contains("application/openmetrics-text") {
            openmetrics = true;
        }
    }
    let path = request.split_whitespace().nth(1).unwrap_or("");
    let (status, kind, body) = if path == "/metrics" || path.starts_with("/metrics?") {
        let body = if openmetrics {
            encode_openmetrics(registry)
        } else {
            encode_text(registry)
        }
        .unwrap_or_default();
        let kind = if openmetrics {
            OPENMETRICS_CONTENT_TYPE
        } else {
            TEXT_CONTENT_TYPE
        };
        ("200 OK", kind, body)
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "eplb serve_metrics: GET /metrics\n".to_owned(),
        )
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// The body of `GET /metrics` at `addr` (Prometheus text format).
fn get_metrics(addr: std::net::SocketAddr) -> std::io::Result<String> {
    use std::io::Read;
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
        _ => Err(std::io::Error::other(format!(
            "unexpected answer: {text:.200}"
        ))),
    }
}

fn main() {
    let mut port = 9464u16;
    let mut trace_path = format!("{}/../data/esft_chain.json", env!("CARGO_MANIFEST_DIR"));
    let (mut pace_ms, mut passes, mut h, mut a) = (10u64, 40usize, 16u32, 2u32);
    let mut policy = "flashlb".to_owned();
    let (mut per_layer, mut faults, mut exit) = (false, true, false);
    let mut record: Option<String> = None;
    let mut dump: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--port" => port = value().parse().expect("--port: a port number"),
            "--trace" => trace_path = value(),
            "--pace-ms" => pace_ms = value().parse().expect("--pace-ms: milliseconds"),
            "--passes" => passes = value().parse().expect("--passes: a count"),
            "--heat-interval" => h = value().parse().expect("--heat-interval: iterations"),
            "--algo-interval" => a = value().parse().expect("--algo-interval: iterations"),
            "--policy" => policy = value(),
            "--record" => record = Some(value()),
            "--dump" => dump = Some(value()),
            "--per-layer" => per_layer = true,
            "--no-faults" => faults = false,
            "--exit" => exit = true,
            other => panic!("unknown argument {other} (see the example's doc comment)"),
        }
    }
    let bytes = std::fs::read(&trace_path).expect("read the trace");
    let replay =
        Replay::load(&bytes, &trace_path, &CostSpec::default()).expect("an eplb-trace/v1 trace");
    // The metrics count the bytes of the model the trace names (DeepSeek-V2-Lite's experts for
    // the demo trace); the host transport moves 64 stand-in bytes per expert.
    let model_expert_bytes = replay.basis.payload.total_bytes() as u64;
    let trace = replay.trace;
    let ranks = 8u16;
    let redundant = 8u32;
    let mut cfg = serde_json::json!({
        "dynamic_eplb": true,
        "expert_heat_collection_interval": h,
        "algorithm_execution_interval": a,
        "num_redundant_experts": redundant,
        "eplb_policy_type": policy,
        "eplb_metrics": {"per_layer": per_layer},
    });
    if let Some(path) = &record {
        cfg["eplb_heat_record_path"] = path.as_str().into();
    }
    let cfg = EplbConfig::from_value(&cfg, &[("DYNAMIC_EPLB", "1")]).expect("a valid config");
    let model = ModelInfo {
        layers: trace.layers as u16,
        experts: trace.experts as u16,
        ranks,
        ranks_per_node: ranks,
        groups: 1,
        max_num_seqs: 256,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let spec = ClusterSpec {
        ranks,
        expert_bytes: 64,
        metrics_expert_bytes: model_expert_bytes,
        passes,
        pace: Some(Duration::from_millis(pace_ms)),
        resume_after: Some(50),
    };
    let kind = cfg.policy();
    let flaky = |rank: usize| -> Option<Box<dyn Policy + Send>> {
        (faults && rank == 3).then(|| {
            Box::new(Flaky {
                inner: policy_for(kind),
                calls: 0,
            }) as Box<dyn Policy + Send>
        })
    };
    let mut cluster = Cluster::build_with(
        &trace,
        &cfg,
        &model,
        &spec,
        |inner| Outages {
            inner,
            collectives: 0,
            faults,
        },
        &flaky,
    )
    .expect("the cluster");
    if faults {
        // Layer 3's exchange fails on rank 5 from 5 s to 10 s of every 30 s.
        let world = std::sync::Arc::clone(cluster.world());
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(5));
                world.inject(3, 5, Fault::Fail);
                std::thread::sleep(Duration::from_secs(5));
                world.clear_faults();
                std::thread::sleep(Duration::from_secs(20));
            }
        });
    }
    let mut registry = Registry::default();
    cluster.register_metrics(&mut registry);
    let registry = Arc::new(registry);
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("the bound address");
    println!(
        "serving http://{addr}/metrics: {ranks} ranks, {} layers x {} experts, H={h} A={a}, \
         {policy}, {} forwards at {pace_ms} ms",
        trace.layers,
        trace.experts,
        trace.windows * passes
    );
    let server = {
        let registry = Arc::clone(&registry);
        std::thread::spawn(move || serve(listener, registry))
    };
    let run = cluster.run().expect("the cluster run");
    println!(
        "done: {} forwards, {} plans taken, {} cycles ended; rank 0: {:?}",
        run.iterations,
        run.plans_taken.len(),
        run.cycles_done.len(),
        run.stats.first()
    );
    if let Some(path) = &dump {
        let body = get_metrics(addr).expect("scrape our own /metrics");
        std::fs::write(path, body).expect("write --dump");
        println!("wrote {path}");
    }
    if !exit {
        println!("still serving the final values; interrupt to stop");
        let _ = server.join();
    }
}
