//! Rank 0's heat recording for replay (`eplb_heat_record_path`): each cycle's gathered heat,
//! folded through the live placement (per window, per layer, per logical expert), appended to an
//! `eplb-trace/v1` file in its line layout, which `eplb report`, `eplb simulate` and `eplb
//! advise` read as any trace.
//!
//! # The line layout of `eplb-trace/v1`
//!
//! Line 1 is the header, an `eplb-trace/v1` object without `counts` and with `"layout":
//! "lines"`: the model's shape (`model.num_moe_layers`, `model.num_experts`), the topology
//! (`topology`: ranks, slots per rank, redundant experts, ranks per node, groups), the intervals
//! (`intervals`: `H`, `A`, iterations per window) and what a count is. Every further line is one
//! window, `{"cycle": k, "counts": [L][N]}`, oldest first, with `"iteration_ms": x` after
//! `cycle` when the engine reported its iteration times (`Controller::record_iteration_ms`: the
//! mean step of the iterations since the previous recorded cycle, ms; the optional
//! `iteration_ms` of `eplb-trace/v1`, which makes the recording an `eplb calibrate --measured`
//! input). A reader (`eplb_map::heat`) takes the windows of every complete line and ignores a
//! last line without its newline.
//!
//! # Safety of the file
//!
//! Every line is written with one `write_all` of the whole line and its newline, then flushed;
//! a crash can leave at most a partial last line, which readers ignore and which the next
//! recorder on the same path cuts off before appending. A file that already holds a recording
//! with the same header is continued; one with another header is left alone (recording stays
//! off, with an error in the log). The file stops growing at its size cap
//! ([`DEFAULT_MAX_BYTES`] unless `eplb_heat_record_max_bytes` says otherwise), with one log line.
//!
//! The formatting and the writes run on a thread of their own: the serving thread only copies
//! the cycle's heat into a bounded channel (once per cycle; a cycle is dropped, with a log line,
//! if the writer is still busy with two earlier ones).
//!
//! # A full disk
//!
//! A write that fails (no space left, an I/O error) stops the recording for good, with one log
//! line: the file is cut back to its last whole line (a write cut short by the error leaves no
//! partial line behind), so what stays is a recording every trace reader replays. A file this
//! recorder created that holds no window yet (only its header) is removed instead, since it
//! is no recording. The serving thread never sees the error: its next cycle's heat is dropped
//! without a copy.
//!
//! **Invariant:** never panics and never fails the serving path: an I/O error stops the
//! recording with one log line, and leaves the file as whole lines only.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

use eplb_core::Shape;
use eplb_core::heat::layout_for_interval;

/// The default size cap of a heat recording: 1 GiB, the CLI's default input limit, so that a
/// capped recording can still be replayed.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// What the header of a recording says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMeta {
    /// The model's shape and topology.
    pub shape: Shape,
    /// `H`.
    pub heat_interval: u32,
    /// `A`.
    pub algo_interval: u32,
}

impl RecordMeta {
    /// The header line (without its newline) of a recording at `path`.
    pub fn header(&self, path: &Path) -> String {
        let s = &self.shape;
        let per = layout_for_interval(self.heat_interval)
            .map(|(_, per)| per)
            .unwrap_or(1);
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or("eplb-heat");
        serde_json::json!({
            "format": eplb_map::heat::TRACE_FORMAT,
            "layout": "lines",
            "name": name,
            "model": {
                "num_moe_layers": s.layers(),
                "num_experts": s.experts(),
            },
            "topology": {
                "ranks": s.ranks(),
                "slots_per_rank": s.slots_per_rank(),
                "redundant_experts": s.redundant(),
                "ranks_per_node": s.ranks_per_node(),
                "groups": s.groups(),
            },
            "intervals": {
                "expert_heat_collection_interval": self.heat_interval,
                "algorithm_execution_interval": self.algo_interval,
                "iterations_per_window": per,
            },
            "phase": "serving",
            "unit": "number of (token, routed expert) assignments",
            "window": format!("{per} counted iterations of one cycle's heat"),
            "per_rank_origin": null,
            "source": "eplb-runtime heat recording (rank 0): the gathered slot heat of each cycle folded through the live placement",
        })
        .to_string()
    }
}

/// One cycle's heat on its way to the writer thread.
struct CycleHeat {
    cycle: u64,
    windows: usize,
    /// The engine's mean iteration time over the cycle, ms (finite, `> 0`).
    iteration_ms: Option<f64>,
    /// `[T][L][N]`.
    samples: Vec<f64>,
}

/// Appends each cycle's heat to a recording (rank 0; see the module docs).
#[derive(Debug)]
pub struct HeatRecorder {
    tx: Option<SyncSender<CycleHeat>>,
    writer: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl std::fmt::Debug for CycleHeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CycleHeat")
            .field("cycle", &self.cycle)
            .field("windows", &self.windows)
            .finish_non_exhaustive()
    }
}

impl HeatRecorder {
    /// Opens (or continues) the recording at `path`, capped at `max_bytes`, and starts its
    /// writer thread.
    pub fn open(path: &Path, max_bytes: u64, meta: RecordMeta) -> io::Result<Self> {
        let header = meta.header(path);
        let (file, written, created) = open_recording(path, &header)?;
        let (tx, rx) = sync_channel::<CycleHeat>(2);
        let writer = Writer::new(file, written, created, max_bytes, path, meta.shape);
        let handle = std::thread::Builder::new()
            .name("eplb-heat-record".into())
            .spawn(move || writer.run(rx))?;
        Ok(Self {
            tx: Some(tx),
            writer: Some(handle),
            path: path.to_path_buf(),
        })
    }

    /// The recording's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Hands cycle `cycle`'s heat (`windows` windows, `[T][L][N]`) to the writer; never blocks.
    pub fn record(&mut self, cycle: u64, windows: usize, samples: &[f64]) {
        self.record_timed(cycle, windows, samples, None);
    }

    /// [`HeatRecorder::record`], with the engine's mean iteration time over the cycle (ms),
    /// written as each of its windows' `iteration_ms` when finite and `> 0` (dropped
    /// otherwise).
    pub fn record_timed(
        &mut self,
        cycle: u64,
        windows: usize,
        samples: &[f64],
        iteration_ms: Option<f64>,
    ) {
        let Some(tx) = &self.tx else {
            return;
        };
        let heat = CycleHeat {
            cycle,
            windows,
            iteration_ms: iteration_ms.filter(|x| x.is_finite() && *x > 0.0),
            samples: samples.to_vec(),
        };
        match tx.try_send(heat) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => log::warn!(
                "eplb: heat recording {}: the writer is behind; cycle {cycle} not recorded",
                self.path.display()
            ),
            Err(TrySendError::Disconnected(_)) => self.tx = None,
        }
    }

    /// Waits until every cycle handed over is written (for tests and shutdown).
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.tx = None;
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
    }
}

impl Drop for HeatRecorder {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where a recording's bytes go: its file, or in tests a writer that fails on purpose.
trait Sink: io::Write {
    /// Cuts the recording to its first `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Removes the recording (it holds no window).
    fn remove(&mut self, path: &Path) -> io::Result<()>;
}

impl Sink for File {
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn remove(&mut self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// Writes the header line of a new (empty) recording; on an error the header's part that was
/// written is removed with the file, and the error returned. Returns the header line's length.
fn write_header<S: Sink>(sink: &mut S, path: &Path, header: &str) -> io::Result<u64> {
    let mut line = String::with_capacity(header.len() + 1);
    line.push_str(header);
    line.push('\n');
    match sink.write_all(line.as_bytes()).and_then(|()| sink.flush()) {
        Ok(()) => Ok(line.len() as u64),
        Err(e) => {
            let _ = sink.set_len(0);
            let _ = sink.remove(path);
            Err(e)
        }
    }
}

/// Opens `path` for appending: a new file gets `header`; an existing one must start with it
/// (its partial last line, if any, is cut off). Returns the file, its length and whether this
/// call created the recording (wrote its header).
fn open_recording(path: &Path, header: &str) -> io::Result<(File, u64, bool)> {
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    let len = file.metadata()?.len();
    if len == 0 {
        let written = write_header(&mut file, path, header)?;
        return Ok((file, written, true));
    }
    // Compare the first line with ours.
    let mut first = vec![0u8; header.len() + 1];
    file.seek(SeekFrom::Start(0))?;
    let got = read_up_to(&mut file, &mut first)?;
    if got != first.len() || first.get(..header.len()) != Some(header.as_bytes()) {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} holds another recording or another file (its first line is not this \
                 model's header); move it away to record",
                path.display()
            ),
        ));
    }
    // Cut a partial last line.
    let mut end = len;
    let mut byte = [0u8; 1];
    while end > 0 {
        file.seek(SeekFrom::Start(end - 1))?;
        file.read_exact(&mut byte)?;
        if byte == [b'\n'] {
            break;
        }
        end -= 1;
    }
    if end < len {
        log::warn!(
            "eplb: heat recording {}: cut a partial last line ({} bytes) before appending",
            path.display(),
            len - end
        );
        file.set_len(end)?;
    }
    Ok((file, end, false))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let Some(rest) = buf.get_mut(n..) else {
            break;
        };
        match file.read(rest)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The writer thread's state.
struct Writer<S> {
    sink: S,
    /// The recording's length in whole lines: what a failed write is cut back to.
    written: u64,
    /// Window lines this writer appended.
    windows: u64,
    /// Whether this writer's recorder created the file (wrote its header).
    created: bool,
    cap: u64,
    path: PathBuf,
    shape: Shape,
    stopped: bool,
    /// Log lines about a failed write (at most one).
    errors_logged: u32,
}

impl<S: Sink> Writer<S> {
    fn new(sink: S, written: u64, created: bool, cap: u64, path: &Path, shape: Shape) -> Self {
        Self {
            sink,
            written,
            windows: 0,
            created,
            cap,
            path: path.to_path_buf(),
            shape,
            stopped: false,
            errors_logged: 0,
        }
    }

    /// Writes cycles until the serving side hangs up or recording stops (then the receiver is
    /// dropped, so the serving side stops handing heat over).
    fn run(mut self, rx: Receiver<CycleHeat>) {
        let mut line = String::new();
        while let Ok(heat) = rx.recv() {
            if !self.write_cycle(&heat, &mut line) {
                return;
            }
        }
    }

    /// Appends one cycle's windows, a line each; `false` once recording stopped.
    fn write_cycle(&mut self, heat: &CycleHeat, line: &mut String) -> bool {
        if self.stopped {
            return false;
        }
        let ln = self.shape.loads_len();
        let n = self.shape.experts().max(1);
        for w in 0..heat.windows {
            let Some(window) = heat.samples.get(w * ln..(w + 1) * ln) else {
                break;
            };
            line.clear();
            let _ = write!(line, "{{\"cycle\":{},", heat.cycle);
            if let Some(ms) = heat.iteration_ms {
                // Rust's shortest round-trip form: a JSON number.
                let _ = write!(line, "\"iteration_ms\":{ms},");
            }
            line.push_str("\"counts\":[");
            for (l, layer) in window.chunks(n).enumerate() {
                if l > 0 {
                    line.push(',');
                }
                line.push('[');
                for (e, &x) in layer.iter().enumerate() {
                    if e > 0 {
                        line.push(',');
                    }
                    // Whole token counts, exact in f64 (sums of u64 counts below 2^53).
                    let v = if x.is_finite() && x > 0.0 {
                        x as u64
                    } else {
                        0
                    };
                    let _ = write!(line, "{v}");
                }
                line.push(']');
            }
            line.push_str("]}\n");
            if !self.append(line) {
                return false;
            }
        }
        true
    }

    /// Appends one whole line; `false` once recording stopped.
    fn append(&mut self, line: &str) -> bool {
        let len = line.len() as u64;
        if self.written.saturating_add(len) > self.cap {
            log::warn!(
                "eplb: heat recording {} stopped at its size cap of {} bytes \
                 (eplb_heat_record_max_bytes); serving and balancing continue",
                self.path.display(),
                self.cap
            );
            self.stopped = true;
            return false;
        }
        let res = self
            .sink
            .write_all(line.as_bytes())
            .and_then(|()| self.sink.flush());
        match res {
            Ok(()) => {
                self.written += len;
                self.windows += 1;
                true
            }
            Err(e) => {
                self.fail(&e);
                false
            }
        }
    }

    /// Stops recording after the write error `e`: cuts the file back to its last whole line
    /// (or removes a file this recorder created that holds no window), and logs once.
    fn fail(&mut self, e: &io::Error) {
        self.stopped = true;
        let path = self.path.display();
        let kept = if self.created && self.windows == 0 {
            match self
                .sink
                .set_len(0)
                .and_then(|()| self.sink.remove(&self.path))
            {
                Ok(()) => "it held no window yet and is removed".to_string(),
                Err(c) => format!("it held no window yet and could not be removed ({c})"),
            }
        } else {
            match self.sink.set_len(self.written) {
                Ok(()) => format!(
                    "it keeps its whole lines ({} bytes) and replays as a trace",
                    self.written
                ),
                Err(c) => format!(
                    "its partial last line could not be cut away ({c}); trace readers ignore it"
                ),
            }
        };
        self.errors_logged += 1;
        log::error!(
            "eplb: heat recording {path} stopped: {e}; {kept}; serving and balancing continue"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn meta() -> RecordMeta {
        RecordMeta {
            shape: Shape::new(2, 3, 2, 2).unwrap(),
            heat_interval: 2,
            algo_interval: 1,
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("eplb-heat-rec-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Two windows of `[2][3]`.
    const SAMPLES: [f64; 12] = [1., 2., 3., 4., 5., 6., 7., 8., 9., 0., 0., 12.];

    #[test]
    fn appends_whole_lines_and_continues_a_cut_recording() {
        let d = dir("append");
        let path = d.join("h.jsonl");
        let mut r = HeatRecorder::open(&path, DEFAULT_MAX_BYTES, meta()).unwrap();
        r.record(1, 2, &SAMPLES);
        r.finish();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1], r#"{"cycle":1,"counts":[[1,2,3],[4,5,6]]}"#);
        assert_eq!(lines[2], r#"{"cycle":1,"counts":[[7,8,9],[0,0,12]]}"#);
        // A crash mid-line: the next recorder cuts it and appends after the last whole line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"cycle":2,"counts":[[1,"#).unwrap();
        drop(f);
        let mut r = HeatRecorder::open(&path, DEFAULT_MAX_BYTES, meta()).unwrap();
        r.record(2, 1, &SAMPLES[..6]);
        r.finish();
        let again = std::fs::read_to_string(&path).unwrap();
        assert_eq!(again.lines().count(), 4, "{again}");
        assert!(again.starts_with(&text));
        assert!(again.ends_with("{\"cycle\":2,\"counts\":[[1,2,3],[4,5,6]]}\n"));
        let heat = eplb_map::heat::load_heat(again.as_bytes(), None).unwrap();
        assert_eq!(heat.windows(), 3);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn windows_carry_the_engines_iteration_time_when_given() {
        let d = dir("timed");
        let path = d.join("t.jsonl");
        let mut r = HeatRecorder::open(&path, DEFAULT_MAX_BYTES, meta()).unwrap();
        // Two cycles at a time: the channel holds two.
        r.record_timed(1, 2, &SAMPLES, Some(12.5));
        r.record_timed(2, 1, &SAMPLES[..6], Some(f64::NAN));
        r.finish();
        let mut r = HeatRecorder::open(&path, DEFAULT_MAX_BYTES, meta()).unwrap();
        r.record_timed(3, 1, &SAMPLES[..6], Some(40.0));
        r.record(4, 1, &SAMPLES[..6]);
        r.finish();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1..],
            [
                r#"{"cycle":1,"iteration_ms":12.5,"counts":[[1,2,3],[4,5,6]]}"#,
                r#"{"cycle":1,"iteration_ms":12.5,"counts":[[7,8,9],[0,0,12]]}"#,
                r#"{"cycle":2,"counts":[[1,2,3],[4,5,6]]}"#,
                r#"{"cycle":3,"iteration_ms":40,"counts":[[1,2,3],[4,5,6]]}"#,
                r#"{"cycle":4,"counts":[[1,2,3],[4,5,6]]}"#,
            ]
        );
        // Still a trace every reader takes.
        let heat = eplb_map::heat::load_heat(text.as_bytes(), None).unwrap();
        assert_eq!(heat.windows(), 5);
        std::fs::remove_dir_all(d).unwrap();
    }

    /// A disk that holds `room` more bytes: a write takes what fits and then fails (as a full
    /// file system does: a short write, then `ENOSPC`).
    struct FullDisk {
        bytes: Vec<u8>,
        room: usize,
        writes_after_failure: usize,
        failed: bool,
        removed: bool,
        /// `set_len` fails too.
        stuck: bool,
    }

    impl FullDisk {
        fn new(bytes: &[u8], room: usize) -> Self {
            Self {
                bytes: bytes.to_vec(),
                room,
                writes_after_failure: 0,
                failed: false,
                removed: false,
                stuck: false,
            }
        }
    }

    impl io::Write for FullDisk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.failed {
                self.writes_after_failure += 1;
            }
            if self.room == 0 {
                self.failed = true;
                return Err(io::Error::from_raw_os_error(28));
            }
            let n = buf.len().min(self.room);
            self.bytes.extend_from_slice(&buf[..n]);
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink for FullDisk {
        fn set_len(&mut self, len: u64) -> io::Result<()> {
            if self.stuck {
                return Err(io::Error::from_raw_os_error(5));
            }
            self.bytes.truncate(len as usize);
            Ok(())
        }

        fn remove(&mut self, _: &Path) -> io::Result<()> {
            self.removed = true;
            Ok(())
        }
    }

    fn cycle(cycle: u64, windows: usize) -> CycleHeat {
        CycleHeat {
            cycle,
            windows,
            iteration_ms: None,
            samples: SAMPLES[..windows * 6].to_vec(),
        }
    }

    #[test]
    fn a_full_disk_leaves_whole_lines_logs_once_and_writes_no_more() {
        let path = Path::new("full.jsonl");
        let header = meta().header(path);
        let mut disk = FullDisk::new(b"", usize::MAX);
        let head = write_header(&mut disk, path, &header).unwrap();
        let line = r#"{"cycle":1,"counts":[[1,2,3],[4,5,6]]}"#.len() + 1;
        // Room for one window line and half of the next.
        disk.room = line + line / 2;
        let mut w = Writer::new(disk, head, true, DEFAULT_MAX_BYTES, path, meta().shape);
        let mut buf = String::new();
        assert!(!w.write_cycle(&cycle(1, 2), &mut buf));
        assert!(!w.write_cycle(&cycle(2, 2), &mut buf));
        assert!(!w.write_cycle(&cycle(3, 1), &mut buf));
        assert!(w.stopped);
        assert_eq!(w.errors_logged, 1);
        assert_eq!(w.sink.writes_after_failure, 0);
        assert!(!w.sink.removed);
        let text = String::from_utf8(w.sink.bytes.clone()).unwrap();
        assert_eq!(
            text,
            format!("{header}\n{{\"cycle\":1,\"counts\":[[1,2,3],[4,5,6]]}}\n")
        );
        // What `eplb simulate` reads: one window.
        let heat = eplb_map::heat::load_heat(text.as_bytes(), None).unwrap();
        assert_eq!(heat.windows(), 1);
    }

    #[test]
    fn a_continued_recording_is_cut_back_to_its_last_whole_line() {
        let path = Path::new("cont.jsonl");
        let header = meta().header(path);
        let before = format!("{header}\n{{\"cycle\":1,\"counts\":[[1,2,3],[4,5,6]]}}\n");
        // A disk with 10 bytes left: the first window line is cut short.
        let disk = FullDisk::new(before.as_bytes(), 10);
        let mut w = Writer::new(
            disk,
            before.len() as u64,
            false,
            u64::MAX,
            path,
            meta().shape,
        );
        assert!(!w.write_cycle(&cycle(2, 2), &mut String::new()));
        assert_eq!(w.errors_logged, 1);
        assert!(!w.sink.removed);
        assert_eq!(String::from_utf8(w.sink.bytes.clone()).unwrap(), before);
    }

    #[test]
    fn a_new_recording_with_no_window_is_removed_and_a_stuck_file_still_never_panics() {
        let path = Path::new("new.jsonl");
        let header = meta().header(path);
        // The first window does not fit.
        let mut disk = FullDisk::new(b"", header.len() + 1 + 5);
        let head = write_header(&mut disk, path, &header).unwrap();
        let mut w = Writer::new(disk, head, true, u64::MAX, path, meta().shape);
        assert!(!w.write_cycle(&cycle(1, 1), &mut String::new()));
        assert!(w.sink.removed);
        assert!(w.sink.bytes.is_empty());
        assert_eq!(w.errors_logged, 1);
        // Not even the header fits: the error goes back to the opener (which logs it), and the
        // part written is removed.
        let mut disk = FullDisk::new(b"", header.len() / 2);
        let e = write_header(&mut disk, path, &header).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28));
        assert!(disk.removed && disk.bytes.is_empty());
        // The file cannot even be cut: still one log line, no panic, no more writes.
        let mut disk = FullDisk::new(b"", usize::MAX);
        let head = write_header(&mut disk, path, &header).unwrap();
        disk.room = 3;
        disk.stuck = true;
        let mut w = Writer::new(disk, head, false, u64::MAX, path, meta().shape);
        assert!(!w.write_cycle(&cycle(1, 2), &mut String::new()));
        assert!(!w.write_cycle(&cycle(2, 2), &mut String::new()));
        assert_eq!(w.errors_logged, 1);
        assert_eq!(w.sink.writes_after_failure, 0);
    }

    #[test]
    fn another_header_is_left_alone_and_the_cap_stops_growth() {
        let d = dir("cap");
        let other = d.join("other.jsonl");
        std::fs::write(&other, "not a recording\n").unwrap();
        let e = HeatRecorder::open(&other, DEFAULT_MAX_BYTES, meta()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(
            std::fs::read_to_string(&other).unwrap(),
            "not a recording\n"
        );

        let path = d.join("capped.jsonl");
        let header = meta().header(&path).len() as u64 + 1;
        let line = r#"{"cycle":1,"counts":[[1,2,3],[4,5,6]]}"#.len() as u64 + 1;
        // Room for the header and one window line, not two.
        let mut r = HeatRecorder::open(&path, header + line + line / 2, meta()).unwrap();
        r.record(1, 2, &SAMPLES);
        r.record(2, 2, &SAMPLES);
        r.finish();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.len() as u64 <= header + line + line / 2);
        std::fs::remove_dir_all(d).unwrap();
    }
}
