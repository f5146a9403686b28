#!/usr/bin/env python3
"""Our rendering of a Grafana dashboard's panels from its JSON, over scraped metrics (not Grafana).

    render_dashboard.py scrape URL DIR [--every S] [--for S]
        GETs URL every S seconds into DIR/<unix ms>.prom until the server goes away (or S of --for).
    render_dashboard.py render DASHBOARD.json DIR OUT.html
        Evaluates every panel target of the dashboard against the scrapes in DIR and writes one
        self-contained HTML page of SVG charts laid out by the panels' gridPos.

The scrapes are parsed with the reference parser, `prometheus_client.parser
.text_string_to_metric_families` (PyPI `prometheus_client`). The targets are evaluated by a small
PromQL subset, enough for docs/grafana-eplb.json: selectors with `=`/`!=` matchers, `rate` and
`increase` over a range, `sum`/`max`/`min`/`avg` (with `by (...)`), `histogram_quantile`, and
`+ - * /` between vectors with the same labels. Time-series panels draw their threshold lines
(`thresholdsStyle.mode` = `line`); stat panels show the last value.
"""

import html
import json
import math
import os
import re
import sys
import time
import urllib.request

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # pragma: no cover
    sys.exit("error: the reference parser is missing: pip install prometheus_client")


# ---------------------------------------------------------------- scrape


def scrape(url, out_dir, every, duration):
    os.makedirs(out_dir, exist_ok=True)
    start = time.time()
    n = 0
    misses = 0
    while duration is None or time.time() - start < duration:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = r.read().decode()
            misses = 0
        except OSError:
            misses += 1
            if n > 0 and misses >= 3:
                break
            time.sleep(every)
            continue
        with open(os.path.join(out_dir, "%d.prom" % int(time.time() * 1000)), "w") as f:
            f.write(body)
        n += 1
        time.sleep(every)
    print("%d scrapes in %s" % (n, out_dir))


# ---------------------------------------------------------------- data


def load(dir_):
    """[(t seconds, {(name, labels tuple): value})] sorted by time."""
    points = []
    for name in sorted(os.listdir(dir_)):
        if not name.endswith(".prom"):
            continue
        t = int(name[:-5]) / 1000.0
        with open(os.path.join(dir_, name)) as f:
            text = f.read()
        samples = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
        points.append((t, samples))
    points.sort(key=lambda p: p[0])
    return points


# ---------------------------------------------------------------- PromQL subset

TOKEN = re.compile(
    r'\s*(?:(?P<num>\d+(?:\.\d+)?(?:e[-+]?\d+)?)|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'|(?P<str>"(?:[^"\\]|\\.)*")|(?P<dur>\[\d+[smh]\])|(?P<op>!=|=~|[{}(),=+\-*/]))'
)


def tokenize(s):
    out, pos = [], 0
    s = s.strip()
    while pos < len(s):
        m = TOKEN.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError("cannot parse %r at %d" % (s, pos))
        pos = m.end()
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
    return out


class Parser:
    AGGS = ("sum", "max", "min", "avg")

    def __init__(self, text):
        self.toks = tokenize(text)
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else (None, None)

    def take(self, value=None):
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise ValueError("expected %r, got %r" % (value, tok[1]))
        self.i += 1
        return tok

    def parse(self):
        e = self.expr()
        if self.i != len(self.toks):
            raise ValueError("trailing tokens: %r" % (self.toks[self.i:],))
        return e

    def expr(self):
        left = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            left = ("bin", op, left, self.term())
        return left

    def term(self):
        left = self.atom()
        while self.peek()[1] in ("*", "/"):
            op = self.take()[1]
            left = ("bin", op, left, self.atom())
        return left

    def atom(self):
        kind, v = self.peek()
        if kind == "num":
            self.take()
            return ("num", float(v))
        if v == "(":
            self.take("(")
            e = self.expr()
            self.take(")")
            return e
        if kind != "name":
            raise ValueError("unexpected %r" % (v,))
        self.take()
        if v in self.AGGS:
            by = None
            if self.peek()[1] == "by":
                self.take()
                self.take("(")
                by = []
                while self.peek()[1] != ")":
                    by.append(self.take()[1])
                    if self.peek()[1] == ",":
                        self.take()
                self.take(")")
            self.take("(")
            e = self.expr()
            self.take(")")
            return ("agg", v, by, e)
        if v in ("rate", "increase"):
            self.take("(")
            sel = self.selector(self.take()[1])
            kind, d = self.take()
            if kind != "dur":
                raise ValueError("%s needs a range" % v)
            self.take(")")
            unit = {"s": 1, "m": 60, "h": 3600}[d[-2]]
            return (v, sel, int(d[1:-2]) * unit)
        if v == "histogram_quantile":
            self.take("(")
            q = float(self.take()[1])
            self.take(",")
            e = self.expr()
            self.take(")")
            return ("hq", q, e)
        return self.selector(v)

    def selector(self, name):
        matchers = []
        if self.peek()[1] == "{":
            self.take("{")
            while self.peek()[1] != "}":
                label = self.take()[1]
                op = self.take()[1]
                value = json.loads(self.take()[1])
                matchers.append((label, op, value))
                if self.peek()[1] == ",":
                    self.take()
            self.take("}")
        return ("sel", name, matchers)


def match(labels, matchers):
    d = dict(labels)
    for label, op, value in matchers:
        got = d.get(label, "")
        if op == "=" and got != value:
            return False
        if op == "!=" and got == value:
            return False
        if op == "=~" and not re.fullmatch(value, got):
            return False
    return True


def select(samples, name, matchers):
    return {
        labels: v for (n, labels), v in samples.items() if n == name and match(labels, matchers)
    }


def at_or_before(points, t):
    best = None
    for tt, s in points:
        if tt <= t + 1e-9:
            best = (tt, s)
        else:
            break
    return best


def evaluate(node, points, k):
    """The instant vector {labels: value} of `node` at points[k]."""
    t, samples = points[k]
    kind = node[0]
    if kind == "num":
        return {(): node[1]}
    if kind == "sel":
        return select(samples, node[1], node[2])
    if kind in ("rate", "increase"):
        _, (_, name, matchers), window = node
        old = at_or_before(points, t - window) or points[0]
        now = select(samples, name, matchers)
        then = select(old[1], name, matchers)
        span = max(t - old[0], 1e-9)
        out = {}
        for labels, v in now.items():
            inc = v - then.get(labels, 0.0)
            if inc < 0:  # a counter reset
                inc = v
            out[labels] = inc if kind == "increase" else inc / span
        return out
    if kind == "agg":
        _, op, by, inner = node
        groups = {}
        for labels, v in evaluate(inner, points, k).items():
            key = tuple((l, x) for l, x in labels if by is not None and l in by)
            groups.setdefault(key, []).append(v)
        f = {"sum": sum, "max": max, "min": min, "avg": lambda v: sum(v) / len(v)}[op]
        return {key: f(vs) for key, vs in groups.items() if vs}
    if kind == "hq":
        _, q, inner = node
        groups = {}
        for labels, v in evaluate(inner, points, k).items():
            d = dict(labels)
            le = d.pop("le", None)
            if le is None:
                continue
            groups.setdefault(tuple(sorted(d.items())), []).append((float(le), v))
        return {key: quantile(q, sorted(b)) for key, b in groups.items()}
    if kind == "bin":
        _, op, a, b = node
        va, vb = evaluate(a, points, k), evaluate(b, points, k)
        out = {}
        for labels, x in va.items():
            y = vb.get(labels, vb.get((), None)) if len(vb) != 1 else next(iter(vb.values()))
            if y is None:
                continue
            if op == "/":
                out[labels] = x / y if y != 0 else float("nan")
            else:
                out[labels] = {"+": x + y, "-": x - y, "*": x * y}[op]
        return out
    raise ValueError(kind)


def quantile(q, buckets):
    """Prometheus' histogram_quantile over cumulative (le, count) buckets."""
    if not buckets or buckets[-1][1] <= 0:
        return float("nan")
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def legend(fmt, labels):
    d = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt or "") or (
        ",".join("%s=%s" % kv for kv in labels) or "value"
    )


def series_of(target, points):
    node = Parser(target["expr"]).parse()
    out = {}
    for k in range(len(points)):
        for labels, v in evaluate(node, points, k).items():
            out.setdefault(labels, []).append((points[k][0], v))
    return [(legend(target.get("legendFormat"), l), pts) for l, pts in sorted(out.items())]


# ---------------------------------------------------------------- drawing

COLORS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"]
COL_W, ROW_H = 58, 30


def fmt(v, unit):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "bytes":
        for u in ["B", "KiB", "MiB", "GiB", "TiB"]:
            if abs(v) < 1024 or u == "TiB":
                return ("%.0f %s" if u == "B" else "%.2f %s") % (v, u)
            v /= 1024.0
    if unit == "percentunit":
        return "%.1f%%" % (100 * v)
    if unit == "s":
        return "%.0f ms" % (v * 1e3) if abs(v) < 1 else "%.2f s" % v
    if abs(v) >= 1e4:
        return "%.3g" % v
    return "%.3g" % v if v != int(v) else "%d" % v


def timeseries_svg(panel, series, w, h, t0):
    d = panel.get("fieldConfig", {}).get("defaults", {})
    unit = d.get("unit", "short")
    pad_l, pad_r, pad_t, pad_b = 70, 12, 8, 22 + 16 * ((len(series) + 2) // 3)
    pw, ph = w - pad_l - pad_r, h - pad_t - pad_b
    vals = [v for _, pts in series for _, v in pts if not math.isnan(v) and not math.isinf(v)]
    steps = [s for s in d.get("thresholds", {}).get("steps", []) if s.get("value") is not None]
    show_th = d.get("custom", {}).get("thresholdsStyle", {}).get("mode") == "line"
    lo = d.get("min", min(vals) if vals else 0.0)
    hi = d.get("max", max(vals) if vals else 1.0)
    if show_th:
        for s in steps:
            lo, hi = min(lo, s["value"]), max(hi, s["value"])
    if hi <= lo:
        hi = lo + 1.0
    ts = [t for _, pts in series for t, _ in pts] or [t0, t0 + 1]
    x0, x1 = t0, max(max(ts), t0 + 1)
    X = lambda t: pad_l + (t - x0) / (x1 - x0) * pw
    Y = lambda v: pad_t + (1 - (v - lo) / (hi - lo)) * ph
    out = ['<svg width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">' % (w, h)]
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        y = Y(v)
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#2c3235"/>' % (pad_l, pad_l + pw, y, y))
        out.append('<text x="%d" y="%.1f" class="ax" text-anchor="end">%s</text>' % (pad_l - 6, y + 4, html.escape(fmt(v, unit))))
    for i in range(6):
        t = x0 + (x1 - x0) * i / 5
        out.append('<text x="%.1f" y="%d" class="ax" text-anchor="middle">%ds</text>' % (X(t), pad_t + ph + 14, round(t - t0)))
    if show_th:
        for s in steps:
            y = Y(s["value"])
            out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6 4" stroke-width="2"/>'
                       % (pad_l, pad_l + pw, y, y, {"red": "#f2495c"}.get(s["color"], s["color"])))
            out.append('<text x="%d" y="%.1f" class="ax" fill="#f2495c">alert %s</text>' % (pad_l + pw - 60, y - 4, fmt(s["value"], unit)))
    for i, (name, pts) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        segs, cur = [], []
        for t, v in pts:
            if math.isnan(v) or math.isinf(v):
                if cur:
                    segs.append(cur)
                cur = []
                continue
            cur.append("%.1f,%.1f" % (X(t), Y(min(max(v, lo), hi))))
        if cur:
            segs.append(cur)
        for seg in segs:
            out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (c, " ".join(seg)))
        lx = pad_l + (i % 3) * (pw // 3)
        ly = pad_t + ph + 32 + 16 * (i // 3)
        out.append('<rect x="%d" y="%d" width="14" height="4" fill="%s"/><text x="%d" y="%d" class="lg">%s</text>'
                   % (lx, ly - 6, c, lx + 20, ly, html.escape(name)))
    out.append("</svg>")
    return "".join(out)


def render(dashboard_path, dir_, out_path):
    dash = json.load(open(dashboard_path))
    points = load(dir_)
    if not points:
        sys.exit("error: no scrapes in %s" % dir_)
    t0 = points[0][0]
    width = 24 * COL_W
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dash["panels"])
    parts = []
    for p in dash["panels"]:
        g = p["gridPos"]
        x, y, w, h = g["x"] * COL_W, g["y"] * ROW_H, g["w"] * COL_W - 8, g["h"] * ROW_H - 8
        series = [s for tgt in p.get("targets", []) for s in series_of(tgt, points)]
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        if p["type"] == "stat":
            last = series[0][1][-1][1] if series and series[0][1] else None
            body = '<div class="stat">%s</div>' % html.escape(fmt(last, unit))
        else:
            body = timeseries_svg(p, series, w - 2, h - 30, t0)
        parts.append('<div class="panel" style="left:%dpx;top:%dpx;width:%dpx;height:%dpx"><div class="title">%s</div>%s</div>'
                     % (x, y, w, h, html.escape(p["title"]), body))
    span = points[-1][0] - t0
    page = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>%s</title><style>
body{margin:0;background:#111217;color:#ccccdc;font-family:Inter,Helvetica,Arial,sans-serif}
.head{padding:10px 14px;font-size:18px}.head small{color:#8e8e8e;font-size:12px;margin-left:12px}
.grid{position:relative;margin:0 8px;width:%dpx;height:%dpx}
.panel{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:3px;overflow:hidden}
.title{font-size:13px;font-weight:500;padding:6px 8px;height:18px;white-space:nowrap;overflow:hidden}
.stat{font-size:34px;font-weight:500;color:#5794f2;text-align:center;padding-top:14px}
.ax{font-size:10px;fill:#8e8e8e}.lg{font-size:11px;fill:#ccccdc}
</style></head><body><div class="head">%s<small>our rendering of the dashboard's panels from %s (not Grafana): %d scrapes over %d s</small></div>
<div class="grid">%s</div></body></html>""" % (
        html.escape(dash["title"]), width, bottom * ROW_H, html.escape(dash["title"]),
        html.escape(os.path.basename(dashboard_path)), len(points), round(span), "".join(parts))
    with open(out_path, "w") as f:
        f.write(page)
    print("wrote %s (%d panels, %d scrapes)" % (out_path, len(dash["panels"]), len(points)))


def main(argv):
    if len(argv) >= 3 and argv[0] == "scrape":
        every, dur = 1.0, None
        rest = argv[3:]
        while rest:
            if rest[0] == "--every":
                every = float(rest[1])
            elif rest[0] == "--for":
                dur = float(rest[1])
            else:
                sys.exit("unknown option %s" % rest[0])
            rest = rest[2:]
        scrape(argv[1], argv[2], every, dur)
    elif len(argv) == 4 and argv[0] == "render":
        render(argv[1], argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
