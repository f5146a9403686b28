#!/usr/bin/env python3
"""The docs run: every fenced block of README.md, python/README.md and docs/*.md, as written.

`cargo xtask docs` (a step of `cargo xtask test`) runs it; by hand:

    python3 scripts/docs_check.py --eplb target/debug/eplb --python target/python-test-venv/bin/python

What a block's fence says (the first word is the language, the rest are flags):

- ``sh``: run by ``bash -euo pipefail``; ``python``: run by the package's test interpreter
  (``--python``, with the ``eplb`` wheel installed). A block that imports ``torch`` runs with
  ``--torch-python`` (``$EPLB_TORCH_PYTHON``) and is skipped with a warning without it;
  ``sh torch`` (a command that needs torch, such as the toy MoE example) runs with that
  interpreter's directory first on ``PATH`` (so ``python`` is it), skipped the same way.
- ``sh fragment`` (an engine's command line, the gate itself, hardware): ``bash -n``, not run;
  ``python fragment``: ``compile()``, not run; ``rust fragment``: parsed by ``rustfmt`` inside a
  function; ``cpp`` / ``c``: ``g++ -fsyntax-only`` / ``gcc -fsyntax-only`` against the AICPU
  header (skipped with a warning without a compiler); ``json``: parsed.
- ``text``: output, or a listing that is no program; not checked.
- Anything else, or no language at all, is an error: every block says what it is.

Every runnable block runs in a fresh work directory that links each top-level entry of the
repository (so ``data/esft_chain.json`` and ``./python`` resolve as from the repository root,
and what a block writes stays out of the tree), with the built ``eplb`` first on ``PATH``. The
files a user is assumed to have are made there from shipped data, never invented
(:data:`FIXTURES`): ``my_trace.json`` is the vendored ESFT trace, and ``heat/`` holds what
the Python recorder (``EPLB_TRACE_DIR``) writes when vLLM hands it that trace's first 64
windows.

It also checks that every file ``eplb --help`` and each subcommand's ``--help`` name exists in
the repository. Exit status 0 when everything passes, 1 otherwise (each failure listed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "python/README.md", "docs/*.md"]
#: Seconds a block may run.
TIMEOUT = 120
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    flags: list
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path):
    """The fenced blocks of a Markdown file (CommonMark fences, not indented code)."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start = i + 1
        body = []
        i += 1
        while i < len(lines):
            close = FENCE.match(lines[i])
            if close and close.group(2).startswith(fence[0] * len(fence)) and not close.group(3).strip():
                break
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        words = info.replace(",", " ").split()
        yield Block(path, start, words[0] if words else "", words[1:], "\n".join(body) + "\n")


def doc_files():
    out = []
    for pattern in DOCS:
        out.extend(sorted(ROOT.glob(pattern)))
    return out


_fixtures: dict = {}


def make_workdir(python: str) -> Path:
    """A directory that looks like the repository root, with the fixtures (made once)."""
    if not _fixtures:
        made = Path(tempfile.mkdtemp(prefix="eplb-docs-fixtures-"))
        for name, make in FIXTURES.items():
            make(made / name, python)
            _fixtures[name] = made / name
    work = Path(tempfile.mkdtemp(prefix="eplb-docs-"))
    for entry in ROOT.iterdir():
        if entry.name in (".git", "target"):
            continue
        (work / entry.name).symlink_to(entry)
    for name, path in _fixtures.items():
        (work / name).symlink_to(path)
    return work


def _demo_trace(dest: Path, python: str) -> None:
    dest.symlink_to(ROOT / "data" / "esft_chain.json")


#: Windows of the demo trace the recording fixture holds (its first domain): enough for every
#: command of the docs, few enough to keep `advise`'s default grid quick.
RECORDED_WINDOWS = 64


def _recorded_heat(dest: Path, python: str) -> None:
    """What the vLLM adapter records (`EPLB_TRACE_DIR=heat`) when vLLM hands it the demo
    trace's first windows one by one: the Python recorder itself, fed shipped data."""
    dest.mkdir()
    script = (
        "import json, os, sys, numpy as np\n"
        "from eplb.integrations import _record\n"
        "os.environ['EPLB_TRACE_DIR'] = sys.argv[1]\n"
        "counts = np.array(json.load(open(sys.argv[2]))['counts'])\n"
        "for w in counts[: int(sys.argv[3])]:\n"
        "    assert _record.record('vllm', w) is not None\n"
    )
    subprocess.run(
        [python, "-c", script, str(dest), str(ROOT / "data" / "esft_chain.json"),
         str(RECORDED_WINDOWS)],
        check=True,
    )


#: Files the docs assume a user has, made from shipped data in each work directory.
FIXTURES = {
    "my_trace.json": _demo_trace,
    "heat": _recorded_heat,
}


def run(cmd, *, cwd, env, stdin=None, timeout=TIMEOUT):
    """Runs `cmd` in a session of its own; on the timeout the whole session is killed (a block's
    children included) and `subprocess.TimeoutExpired` raised."""
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as p:
        try:
            out, err = p.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


class Checker:
    def __init__(self, args):
        self.args = args
        self.failures = []
        self.warnings = []
        self.counts = {}
        self.env = dict(os.environ)
        eplb_dir = str(Path(args.eplb).resolve().parent)
        self.env["PATH"] = eplb_dir + os.pathsep + self.env.get("PATH", "")
        self.env.pop("DYNAMIC_EPLB", None)
        self.env.pop("EXPERT_MAP_RECORD", None)
        self.env.pop("EPLB_TRACE_DIR", None)
        self.env["PYTHONDONTWRITEBYTECODE"] = "1"

    def fail(self, b: Block, what: str, out=None):
        detail = ""
        if out is not None:
            detail = f"\n  exit {out.returncode}\n" + _indent(out.stdout[-2000:] + out.stderr[-2000:])
        self.failures.append(f"{b.where} ({b.lang} {' '.join(b.flags)}): {what}{detail}")

    def note(self, b: Block, kind: str, seconds: float = 0.0):
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.args.verbose:
            print(f"  {b.where:32} {kind:16} {seconds:6.2f} s")

    def check(self, b: Block):
        lang, flags = b.lang, set(b.flags)
        fragment = "fragment" in flags
        unknown = flags - {"fragment", "torch"}
        if unknown:
            return self.fail(b, f"unknown fence flag(s) {sorted(unknown)}")
        if lang == "text":
            return self.note(b, "text")
        if lang == "sh":
            return self.sh_fragment(b) if fragment else self.sh(b)
        if lang == "python":
            return self.py_fragment(b) if fragment else self.py(b)
        if lang == "rust" and fragment:
            return self.rust_fragment(b)
        if lang in ("cpp", "c") and not fragment:
            return self.c(b)
        if lang == "json" and not fragment:
            try:
                json.loads(b.text)
            except ValueError as e:
                return self.fail(b, f"not JSON: {e}")
            return self.note(b, "json parsed")
        if not lang:
            return self.fail(b, "a fence without a language: say `sh`, `python`, `text`, ...")
        return self.fail(
            b,
            f"`{lang}{' fragment' if fragment else ''}` is not a block kind the docs run knows "
            "(sh, sh torch, python, sh fragment, python fragment, rust fragment, cpp, c, json, text)",
        )

    def sh(self, b: Block):
        env = self.env
        if "torch" in b.flags:
            if not self.args.torch_python:
                self.warnings.append(f"{b.where}: needs torch; EPLB_TORCH_PYTHON is not set, not run")
                return self.note(b, "sh skipped")
            env = dict(self.env)
            torch_bin = str(Path(self.args.torch_python).parent)
            env["PATH"] = torch_bin + os.pathsep + env["PATH"]
        work = make_workdir(self.args.python)
        t0 = time.monotonic()
        try:
            out = run(["bash", "-euo", "pipefail", "-c", b.text], cwd=work, env=env)
        except subprocess.TimeoutExpired:
            return self.fail(b, f"did not finish in {TIMEOUT} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if out.returncode != 0:
            return self.fail(b, "failed", out)
        self.note(b, "sh run", time.monotonic() - t0)

    def sh_fragment(self, b: Block):
        out = run(["bash", "-n"], cwd=ROOT, env=self.env, stdin=b.text)
        if out.returncode != 0:
            return self.fail(b, "not valid shell", out)
        self.note(b, "sh syntax")

    def py(self, b: Block):
        python = self.args.python
        if re.search(r"^\s*(import torch|from torch)", b.text, re.M) or "import torch" in b.text:
            python = self.args.torch_python
            if not python:
                self.warnings.append(f"{b.where}: needs torch; EPLB_TORCH_PYTHON is not set, not run")
                return self.note(b, "python skipped")
        work = make_workdir(self.args.python)
        t0 = time.monotonic()
        try:
            out = run([python, "-"], cwd=work, env=self.env, stdin=b.text)
        except subprocess.TimeoutExpired:
            return self.fail(b, f"did not finish in {TIMEOUT} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if out.returncode != 0:
            return self.fail(b, "failed", out)
        self.note(b, "python run", time.monotonic() - t0)

    def py_fragment(self, b: Block):
        try:
            compile(b.text, b.where, "exec")
        except SyntaxError as e:
            return self.fail(b, f"does not compile: {e}")
        self.note(b, "python compiled")

    def rust_fragment(self, b: Block):
        rustfmt = shutil.which("rustfmt")
        if not rustfmt:
            self.warnings.append(f"{b.where}: rustfmt not found, rust fragment not parsed")
            return self.note(b, "rust skipped")
        # Items (use, fn, struct) and statements both parse inside a function body.
        wrapped = "fn __docs_fragment() {\n" + b.text + "}\n"
        out = run([rustfmt, "--edition", "2024", "--emit", "stdout"], cwd=ROOT, env=self.env, stdin=wrapped)
        if out.returncode != 0:
            return self.fail(b, "does not parse as Rust", out)
        self.note(b, "rust parsed")

    def c(self, b: Block):
        cc = "g++" if b.lang == "cpp" else "gcc"
        if not shutil.which(cc):
            self.warnings.append(f"{b.where}: {cc} not found, not compiled")
            return self.note(b, f"{b.lang} skipped")
        include = ROOT / "eplb-policies" / "aicpu" / "include"
        lang = "c++" if b.lang == "cpp" else "c"
        out = run([cc, "-fsyntax-only", "-Wall", "-Werror", "-I", str(include), "-x", lang, "-"],
                  cwd=ROOT, env=self.env, stdin=b.text)
        if out.returncode != 0:
            return self.fail(b, f"{cc} -fsyntax-only failed", out)
        self.note(b, f"{b.lang} compiled")

    def help_files(self):
        """Every file `eplb --help` and its subcommands' `--help` name is in the repository."""
        top = run([self.args.eplb, "--help"], cwd=ROOT, env=self.env)
        texts = {"eplb --help": top.stdout}
        subs = re.findall(r"^  ([a-z][a-z-]+)\s{2,}", top.stdout.split("Commands:")[-1].split("Options:")[0], re.M)
        for sub in subs:
            if sub == "help":
                continue
            texts[f"eplb {sub} --help"] = run([self.args.eplb, sub, "--help"], cwd=ROOT, env=self.env).stdout
        named = 0
        for where, text in texts.items():
            for name in sorted(set(re.findall(r"[A-Za-z0-9_./-]+\.(?:md|json|csv|html|toml)\b", text))):
                if name.startswith(("http", "eplb_config", "calib")) or "/" not in name and name.islower():
                    # A flag's example value (`--out report.html`, `calib.json`), not a file of ours.
                    continue
                named += 1
                if not (ROOT / name).is_file():
                    self.failures.append(f"{where} names {name}, which is not a file of the repository")
        self.counts["help files named"] = named


def _indent(s: str) -> str:
    return "\n".join("    " + line for line in s.rstrip().splitlines())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eplb", required=True, help="the built eplb binary")
    ap.add_argument("--python", required=True, help="an interpreter with the eplb wheel")
    ap.add_argument("--torch-python", default=os.environ.get("EPLB_TORCH_PYTHON"),
                    help="an interpreter with eplb and torch (default $EPLB_TORCH_PYTHON)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--list", action="store_true", help="list the blocks and their kinds, run nothing")
    ap.add_argument("files", nargs="*", help="Markdown files (default: the docs)")
    args = ap.parse_args()
    files = [Path(f).resolve() for f in args.files] or doc_files()
    if args.list:
        for f in files:
            for b in blocks(f):
                first = b.text.strip().splitlines()[0] if b.text.strip() else ""
                print(f"{b.where:28} {b.lang + ' ' + ' '.join(b.flags):18} {first[:70]}")
        return 0
    args.eplb = str(Path(args.eplb).resolve())
    args.python = str(Path(args.python).absolute())
    if args.torch_python:
        args.torch_python = str(Path(args.torch_python).absolute())
    checker = Checker(args)
    t0 = time.monotonic()
    for f in files:
        if args.verbose:
            print(f"{f.relative_to(ROOT)}")
        for b in blocks(f):
            checker.check(b)
    checker.help_files()
    for path in _fixtures.values():
        shutil.rmtree(path.parent, ignore_errors=True)
        break
    for w in checker.warnings:
        print(f"warning: {w}", file=sys.stderr)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(checker.counts.items()))
    print(f"docs: {len(files)} files, {summary} in {time.monotonic() - t0:.1f} s")
    if checker.failures:
        print(f"\n{len(checker.failures)} failing:", file=sys.stderr)
        for f in checker.failures:
            print(f"- {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
