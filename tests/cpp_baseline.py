"""llama.cpp's own speculative loop (`llama-speculative-simple`) as a test oracle.

`scripts/build_llama_cpp_tools.sh` builds the binary, with libllama.so beside it, from the
llama.cpp that the pinned llama-cpp-python vendors, into a cache outside the repository.
This module finds it, runs it greedily, and parses what it prints:

* stdout: "\\n\\n", the prompt's pieces, the generated pieces, "\\n\\n\\n\\n" (`simple.cpp:92-96, 314-320, 347, 372`);
* stderr at `-lv 5` (LOG_DBG is verbosity 5, `common/log.h:24,120`): per draft position the top
  candidates, " - seq_id 0, draft candidate   0, pos   3:   1234 (   0.871) 'piece'"
  (draft-simple `speculative.cpp:357`, eagle3 `:803`, dflash/dspark `:1284,1303`; candidate 0
  is the drafted token, every one is kept at p_min 0), and
  per round "accepted k/n draft tokens, the last target token is: (id)" (`simple.cpp:323`);
* stderr summary: "encoded N tokens", "decoded N tokens in S seconds", n_drafted, n_accept.

Rounds: draft tokens d1..dn (candidate-0 lines since the previous round), k accepted, and the
target's token t: the round commits d1..dk, t. So the generated tokens are known exactly.

Python parity runs must load the same libraries: `lib_dir()` is the folder for
LLAMA_CPP_LIB_PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "0.3.36"
TOOL = "llama-speculative-simple"
REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "scripts" / "build_llama_cpp_tools.sh"


def tools_dir() -> Path:
    """Where the build script puts the tools (same rule as the script)."""
    env = os.environ.get("SPECGGUF_CPP_TOOLS_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "specgguf" / "llama-cpp-tools" / VERSION


def lib_dir() -> Path:
    return tools_dir() / "bin"


def find_tool() -> Path | None:
    """The built binary, or None when the cache is absent or incomplete (no stamp)."""
    d = tools_dir()
    exe = d / "bin" / TOOL
    if exe.is_file() and os.access(exe, os.X_OK) and (d / "stamp").is_file() and (d / "bin" / "libllama.so").exists():
        return exe
    return None


def require_tool() -> Path:
    """The binary for a test: skip when it was never built, unless SPECGGUF_REQUIRE_CPP=1 (CI)."""
    import pytest

    exe = find_tool()
    if exe is not None:
        return exe
    why = f"{TOOL} is not built in {tools_dir()}; run scripts/build_llama_cpp_tools.sh"
    if os.environ.get("SPECGGUF_REQUIRE_CPP") == "1":
        pytest.fail(why + " (SPECGGUF_REQUIRE_CPP=1)", pytrace=False)
    pytest.skip(why)


@dataclass
class Round:
    drafted: int
    accepted: int
    last: int  # the target's own token that closes the round
    draft_tokens: list[int] | None  # None when the drafter printed no candidate lines

    @property
    def committed(self) -> list[int]:
        return [*(self.draft_tokens or [])[:self.accepted], self.last]


@dataclass
class CppRun:
    args: list[str]
    stdout: str
    stderr: str
    n_predict_arg: int
    rounds: list[Round] = field(default_factory=list)
    prompt_tokens: int = 0
    n_predict: int = 0
    n_drafted: int = 0
    n_accept: int = 0
    decode_s: float = 0.0
    prefill_s: float = 0.0

    @property
    def stopped_at_eog(self) -> bool:
        """The loop only ends with n_predict <= -n when an end-of-generation token came."""
        return self.n_predict <= self.n_predict_arg

    @property
    def tokens(self) -> list[int] | None:
        """The generated tokens (end-of-generation token excluded, as in the printed text);
        None when the drafts were not printed."""
        if any(r.draft_tokens is None for r in self.rounds):
            return None
        out = [t for r in self.rounds for t in r.committed]
        return out[:-1] if self.stopped_at_eog else out

    @property
    def output(self) -> str:
        """Prompt and generated text as printed (the prompt's pieces include special tokens)."""
        out = self.stdout
        out = out[2:] if out.startswith("\n\n") else out
        return out[:-4] if out.endswith("\n\n\n\n") else out

    @property
    def tokens_per_second(self) -> float:
        return self.n_predict / self.decode_s if self.decode_s > 0 else 0.0

    def budget_rounds(self) -> int:
        """How many leading rounds drafted under the same token budget as a Python run with
        max_tokens = -n: the C++ cap n_predict_arg - n_predict - 1 is at least 1 there. Later
        rounds differ by design: at cap <= 0 C++ drafts uncapped (`spec.cpp:2832`) and the loop
        runs until n_predict > -n (`simple.cpp:338`), so it overshoots -n by up to n_max + 1."""
        done = 0
        for i, r in enumerate(self.rounds):
            if self.n_predict_arg - done - 1 < 1:
                return i
            done += r.accepted + 1
        return len(self.rounds)


_ROUND = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")
_CAND0 = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(-?\d+) \(")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
# stderr lines may carry a "0.07.801.773 I " time/level prefix
_COUNT = re.compile(r"\b(n_predict|n_drafted|n_accept)\s*=\s*(-?\d+)\s*$", re.M)


def parse(stdout: str, stderr: str, n_predict_arg: int, args=()) -> CppRun:
    run = CppRun(list(args), stdout, stderr, n_predict_arg)
    pending: list[int] = []
    for line in stderr.splitlines():
        m = _CAND0.search(line)
        if m:
            if int(m.group(1)) == 0:
                pending = []
            pending.append(int(m.group(2)))
            continue
        m = _ROUND.search(line)
        if m:
            k, n, last = map(int, m.groups())
            # candidates come in draft order; a longer list was cut to the budget afterwards
            # ("truncating draft", spec.cpp:2832-2837) or ended on a p_min refusal
            toks = pending[:n] if len(pending) >= n else None
            run.rounds.append(Round(n, k, last, toks))
            pending = []
    if m := _DECODED.search(stderr):
        run.decode_s = float(m.group(2))
    if m := _ENCODED.search(stderr):
        run.prompt_tokens, run.prefill_s = int(m.group(1)), float(m.group(2))
    counts = dict((k, int(v)) for k, v in _COUNT.findall(stderr))
    run.n_predict = counts.get("n_predict", 0)
    run.n_drafted = counts.get("n_drafted", 0)
    run.n_accept = counts.get("n_accept", 0)
    return run


def write_prompt_file(path: Path, prompt: str) -> Path:
    """A `-f` file that the C++ side reads back as exactly `prompt`: it drops one trailing
    newline (`arg.cpp:1807`) and then unescapes backslash sequences (`arg.cpp:920-921`)."""
    path.write_text(prompt.replace("\\", "\\\\") + "\n", encoding="utf-8")
    return path


def run_speculative_simple(target, draft, prompt: str, *, n_predict: int, n_ctx: int, draft_max: int,
                           threads: int, spec_type: str = "draft-simple", verbose: bool = True,
                           workdir: Path | None = None, extra_args=(), timeout: float = 600) -> CppRun:
    """One greedy, CPU-only run of llama-speculative-simple; `verbose` (-lv 5) adds the
    per-round lines that parity needs and costs time (keep it off for timing)."""
    exe = find_tool()
    if exe is None:
        raise FileNotFoundError(f"{TOOL} is not built in {tools_dir()}; run {BUILD_SCRIPT}")
    workdir = Path(workdir or tempfile.gettempdir())
    pfile = write_prompt_file(workdir / f"prompt-{os.getpid()}.txt", prompt)
    args = [str(exe), "-m", str(target), "-f", str(pfile), "-n", str(n_predict), "-c", str(n_ctx),
            "-fit", "off", "-fa", "off", "-ngl", "0", "--temp", "0", "--top-k", "1", "-s", "42",
            "-t", str(threads), "-tb", str(threads)]
    if draft is not None:
        args += ["-md", str(draft), "-ngld", "0", "-td", str(threads), "-tbd", str(threads)]
    if spec_type:
        args += ["--spec-type", spec_type, "--spec-draft-n-max", str(draft_max),
                 "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    if verbose:
        args += ["-lv", "5"]
    args += [str(a) for a in extra_args]
    try:
        for _ in range(5):
            proc = subprocess.run(args, capture_output=True, timeout=timeout)
            out, err = proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
            if proc.returncode != 0:
                raise RuntimeError(f"{TOOL} exited with {proc.returncode}:\n{' '.join(args)}\n{err[-3000:]}")
            # Seen on a loaded 2-core machine: the log thread's stderr sometimes stops early
            # (stdout complete, exit code 0), even inside the summary. The summary is logged
            # last, so all of its counts present means nothing was lost; the run is
            # deterministic, so otherwise run it again.
            if {k for k, _ in _COUNT.findall(err)} >= {"n_predict", "n_drafted", "n_accept"}:
                return parse(out, err, n_predict, args)
        raise RuntimeError(f"{TOOL} printed no complete summary in 5 runs:\n{' '.join(args)}\n{err[-3000:]}")
    finally:
        pfile.unlink(missing_ok=True)
