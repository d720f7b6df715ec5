"""Parity with llama.cpp's own speculative loop, `llama-speculative-simple`.

Both sides run the very same libllama (the Python side through LLAMA_CPP_LIB_PATH), the
same thread count, context size and prompt tokens, greedily. They must agree on every round:
how many tokens were drafted, how many of them the target accepted, and the tokens generated.

Rounds are compared while the C++ token budget cap (-n minus tokens so far minus 1) is >= 1;
there both loops cap the draft identically. After that llama-speculative-simple drafts
uncapped and keeps going until it has MORE than -n tokens (docs/loop.md §6.3), whereas
specgguf stops at exactly max_tokens; so our tokens are compared with the prefix of its tokens.

Adding a draft kind is one row in CASES: the C++ --spec-type, fixtures (tests/conftest.py)
for target and draft, our --draft value if it is not the draft's path, and settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

import cpp_baseline

THREADS = 2
PROMPT_EN = "The quick brown fox jumps over the lazy dog. A speculative decoder"
PROMPT_CODE = 'def add(a, b):\n    return a + b\nprint("1\\t2", add(1, 2))'  # a real backslash: -f unescapes
PROMPT_GEMMA = "Write a short story about a robot who learns to paint.\nOnce upon a time"


@dataclass(frozen=True)
class Case:
    id: str
    spec_type: str  # llama-speculative-simple --spec-type
    target: str  # fixture name (tests/conftest.py) of the target GGUF
    draft: str | None  # fixture name of the draft GGUF given to -md (None: none, e.g. the target's own MTP)
    prompt: str = PROMPT_EN
    n_predict: int = 48
    draft_max: int = 4
    n_ctx: int = 1024
    our_draft: str | None = None  # our --draft value when it is not the draft's path (e.g. "ngram")
    our_args: tuple = ()  # extra `specgguf generate` arguments
    cpp_args: tuple = ()  # extra llama-speculative-simple arguments


CASES = [
    Case("model-qwen3-synthetic", "draft-simple", "qwen3_target", "qwen3_draft", draft_max=4),
    Case("model-qwen3-synthetic-n8", "draft-simple", "qwen3_target", "qwen3_draft", prompt=PROMPT_CODE,
         draft_max=8, n_predict=61),
    Case("model-gemma3-270m", "draft-simple", "gemma_path", "gemma_draft_path", prompt=PROMPT_GEMMA,
         draft_max=6, n_predict=48),
    # hidden-state kinds: `draft` names an entry of the hidden_drafts fixture
    Case("eagle3-own-head", "draft-eagle3", "qwen3_target", "eagle3"),
    Case("eagle3-shared-head", "draft-eagle3", "qwen3_target", "eagle3-shared"),
    Case("eagle3-counting", "draft-eagle3", "counting_target", "eagle3-counting", n_predict=40),
    Case("dflash-own-head", "draft-dflash", "qwen3_target", "dflash"),
    Case("dflash-shared-head", "draft-dflash", "qwen3_target", "dflash-shared", draft_max=6),
    Case("dspark-counting", "draft-dspark", "counting_target", "dspark-counting", n_predict=40),
    Case("dspark-counting-shared-head", "draft-dspark", "counting_target", "dspark-counting-shared", draft_max=6),
    Case("dspark-confidence-p-min", "draft-dspark", "counting_target", "dspark-counting", n_predict=40,
         our_args=("--draft-p-min", "0.6"), cpp_args=("--spec-draft-p-min", "0.6")),
    # hybrid targets (decoding/rollback.py): for these kinds both loops take rejected tails back
    # through recurrent-state snapshots (n_rs_seq = the draft length)
    *[Case(f"{kind}-{arch}", f"draft-{kind.split('-')[0]}", f"{arch}_target", kind, n_predict=40)
      for arch in ("lfm2", "qwen35") for kind in ("eagle3-counting", "dflash", "dspark-counting")],
    # the target's own MTP block (qwen35's NextN layer): --spec-type draft-mtp without -md
    Case("mtp-qwen35-own-block", "draft-mtp", "qwen35_mtp_target", None, n_predict=40, our_draft="mtp"),
]


def run_specgguf(target, draft: str | None, prompt: str, *, n_predict: int, n_ctx: int, draft_max: int,
                 extra=()) -> dict:
    """`specgguf generate --json` in a subprocess on the C++ tool's own libllama."""
    args = [sys.executable, "-m", "specgguf", "generate", str(target), "-p", prompt, "-n", str(n_predict),
            "--ctx", str(n_ctx), "--threads", str(THREADS), "--json", *map(str, extra)]
    if draft is not None:
        args += ["--draft", str(draft), "--draft-max", str(draft_max)]
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(cpp_baseline.lib_dir()))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_python_loads_the_tools_libraries(qwen3_target):
    """LLAMA_CPP_LIB_PATH really swaps the library: after loading a model, every libllama and
    the ggml CPU backend mapped into the process come from the tool's folder."""
    cpp_baseline.require_tool()
    code = (
        "import sys; from specgguf.runtime import native\n"
        "m = native.Model(sys.argv[1])\n"
        "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') "
        "if 'libllama' in l or 'libggml' in l})))\n"
    )
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(cpp_baseline.lib_dir()))
    proc = subprocess.run([sys.executable, "-c", code, str(qwen3_target)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    mapped = proc.stdout.split()
    tool_dir = os.path.realpath(cpp_baseline.lib_dir())
    ours = [p for p in mapped if os.path.dirname(os.path.realpath(p)) == tool_dir]
    names = {os.path.basename(p).split(".so")[0] for p in ours}
    assert {"libllama", "libggml", "libggml-base", "libggml-cpu"} <= names, mapped
    foreign = [p for p in mapped if p not in ours and any(n in p for n in ("libllama", "libggml-base", "libggml-cpu"))]
    assert not foreign, f"libraries loaded from elsewhere: {foreign}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rounds_and_tokens_match_llama_cpp(case: Case, request, tmp_path):
    cpp_baseline.require_tool()
    target = request.getfixturevalue(case.target)
    if case.draft is None:
        draft = None
    elif case.spec_type in ("draft-eagle3", "draft-dflash", "draft-dspark"):
        draft = request.getfixturevalue("hidden_drafts")[case.draft]
    else:
        draft = request.getfixturevalue(case.draft)
    cpp = cpp_baseline.run_speculative_simple(
        target, draft, case.prompt, n_predict=case.n_predict, n_ctx=case.n_ctx, draft_max=case.draft_max,
        threads=THREADS, spec_type=case.spec_type, workdir=tmp_path, extra_args=case.cpp_args)
    ours = run_specgguf(target, case.our_draft or draft, case.prompt, n_predict=case.n_predict, n_ctx=case.n_ctx,
                        draft_max=case.draft_max, extra=case.our_args)
    stats = ours["stats"]

    assert cpp.rounds, "no per-round lines parsed: is -lv 5 still what prints LOG_DBG?\n" + cpp.stderr[-2000:]
    assert stats["prompt_tokens"] == cpp.prompt_tokens, "the two sides tokenized the prompt differently"
    # the per-round lines add up to the C++ summary (the parser saw every round)
    assert cpp.n_drafted == sum(r.drafted for r in cpp.rounds)
    assert cpp.n_accept == sum(r.accepted for r in cpp.rounds)
    assert cpp.n_predict == sum(r.accepted + 1 for r in cpp.rounds)

    # rounds: identical (drafted, accepted) while both loops cap drafts by the same budget
    m = cpp.budget_rounds()
    cpp_rounds = [[r.drafted, r.accepted] for r in cpp.rounds]
    assert stats["rounds_detail"][:m] == cpp_rounds[:m], (stats["rounds_detail"], cpp_rounds)
    if cpp.stopped_at_eog and ours["finish_reason"] == "stop":
        assert stats["rounds_detail"] == cpp_rounds
    else:
        # past the budget: ours may close with one undrafted round, C++ overshoots
        assert len(stats["rounds_detail"]) - m in (0, 1), (stats["rounds_detail"], cpp_rounds, m)
    assert sum(a + 1 for _, a in stats["rounds_detail"][:m]) == sum(r.accepted + 1 for r in cpp.rounds[:m])

    # tokens: ours (exactly max_tokens, or up to the end-of-generation token) = C++'s prefix
    cpp_tokens = cpp.tokens
    assert cpp_tokens is not None, "the C++ drafter printed no draft candidates"
    assert ours["tokens"] == cpp_tokens[:len(ours["tokens"])]
    if ours["finish_reason"] == "length":
        assert len(ours["tokens"]) == case.n_predict <= len(cpp_tokens)
    else:
        assert ours["tokens"] == cpp_tokens and cpp.stopped_at_eog
    assert ours["text"].replace("\x00", "") in cpp.output  # the C++ tool prints a NUL piece as nothing


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_model_drafts_on_hybrids_match_llama_cpp_output(arch, request, tmp_path):
    """A model draft on a hybrid target: llama-speculative-simple takes partial acceptances back
    by a checkpoint, and then verifies the accepted tokens again in a round of their own (it
    asks for snapshots only for mtp/eagle3/dflash/dspark drafts: common_params_speculative::
    need_n_rs_seq); specgguf takes them back by a snapshot and drafts on at once. So rounds
    differ after the first partial acceptance, by design: the text is the same, the rounds agree
    up to there, and specgguf needs no more target passes."""
    cpp_baseline.require_tool()
    target, draft = request.getfixturevalue(f"{arch}_target"), request.getfixturevalue(f"{arch}_draft")
    cpp = cpp_baseline.run_speculative_simple(target, draft, PROMPT_EN, n_predict=40, n_ctx=1024, draft_max=4,
                                              threads=THREADS, spec_type="draft-simple", workdir=tmp_path)
    ours = run_specgguf(target, draft, PROMPT_EN, n_predict=40, n_ctx=1024, draft_max=4)
    assert "will use checkpoints" in cpp.stderr  # what the comparison above assumes of the C++ loop
    assert ours["text"].replace("\x00", "") in cpp.output  # the C++ tool prints a NUL piece as nothing
    rounds = ours["stats"]["rounds_detail"]
    assert ours["stats"]["rollback"]["mode"] == "snapshots"
    first_partial = next((i for i, (n, k) in enumerate(rounds) if k < n), len(rounds))
    cpp_rounds = [[r.drafted, r.accepted] for r in cpp.rounds]
    assert rounds[:first_partial] == cpp_rounds[:first_partial]
    cpp_passes = len(cpp_rounds) + cpp.stderr.count("restoring checkpoint")  # printed rounds + discarded ones
    assert len(rounds) <= cpp_passes


def test_parser_reads_rounds_and_summary():
    """The output parser on a recorded excerpt (no binary needed): draft tokens come from the
    candidate-0 lines, a round closes at its 'accepted' line, the summary has a log prefix."""
    err = """\
0.01.000.001 D spec        draft:  - seq_id 0, draft candidate   0, pos   0:     11 (   0.900) 'a'
0.01.000.002 D spec        draft:  - seq_id 0, draft candidate   1, pos   0:     99 (   0.100) 'z'
0.01.000.003 D spec        draft:  - seq_id 0, draft candidate   0, pos   1:     12 (   0.800) 'b'
0.01.000.004 D accepted 1/2 draft tokens, the last target token is: (13)
0.01.000.005 D spec        draft:  - seq_id 0, draft candidate   0, pos   0:     14 (   0.700) 'c'
0.01.000.006 D accepted 1/1 draft tokens, the last target token is: (15)
0.01.000.007 I encoded    5 tokens in    0.391 seconds, speed:   12.781 t/s
0.01.000.008 I decoded    4 tokens in    0.500 seconds, speed:    8.000 t/s
0.01.000.009 I n_predict = 4
0.01.000.010 I n_drafted = 3
0.01.000.011 I n_accept  = 2
"""
    run = cpp_baseline.parse("\n\n<bos>Hi abc\n\n\n\n", err, n_predict_arg=3)
    assert [(r.drafted, r.accepted, r.draft_tokens, r.last) for r in run.rounds] == [(2, 1, [11, 12], 13),
                                                                                     (1, 1, [14], 15)]
    assert run.tokens == [11, 13, 14, 15] and not run.stopped_at_eog
    assert (run.prompt_tokens, run.n_predict, run.n_drafted, run.n_accept) == (5, 4, 3, 2)
    assert run.decode_s == 0.5 and run.output == "<bos>Hi abc"
    assert run.budget_rounds() == 1  # the second round started with a cap of 3 - 2 - 1 = 0


def test_prompt_file_reads_back_exactly(tmp_path):
    """-f drops one trailing newline and unescapes backslashes: the file compensates both."""
    p = cpp_baseline.write_prompt_file(tmp_path / "p.txt", 'a\\tb\nc\n')
    assert p.read_text() == 'a\\\\tb\nc\n\n'
