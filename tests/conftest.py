"""Shared fixtures: the real Gemma 3 270M (and a requantized copy as a plain draft), and
tiny synthetic qwen3 models built once per test session."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specgguf.synthetic.qwen3 import QwenShape, write_qwen3
from specgguf.synthetic.gemma4 import Gemma4Shape, write_gemma4

# sqrt(96) = 9.798 is not a bf16 number (it rounds to 9.8125): the embedding scale's rounding shows
GEMMA4_WIDE = Gemma4Shape(n_embd=96)


@pytest.fixture(scope="session", autouse=True)
def llama_cpp_python_as_specgguf_loads():
    """Tests put `llama_cpp.Llama` beside specgguf on the same file: on a build whose AMX
    kernels crash on this CPU it must load as specgguf does (runtime/amx.py), or it dies."""
    from specgguf.runtime import native

    native.guard_llama_cpp_python()


def require_eagle3_patch(gemma: bool = False) -> bool:
    """True when the loaded libllama has specgguf's eagle3 patches (0003, Gemma 4's layer,
    too with gemma=True); else the test skips, or fails under SPECGGUF_REQUIRE_PATCHED=1
    (CI's patched stage, where a skip would hide a broken build)."""
    from specgguf.runtime import native, patchprobe

    if patchprobe.has_eagle3_patch(gemma=gemma):
        return True
    which = " (0001-0003)" if gemma else ""
    if os.environ.get("SPECGGUF_REQUIRE_PATCHED") == "1":
        pytest.fail(f"SPECGGUF_REQUIRE_PATCHED=1 but {native.library_path()} lacks the eagle3 patches{which}")
    pytest.skip(f"the loaded libllama lacks specgguf's eagle3 patches{', 0003 included' if gemma else ''} "
                f"(build it with {patchprobe.BUILD_COMMAND})")


@pytest.fixture(scope="session")
def gemma4_wide_target(tmp_path_factory):
    """A synthetic Gemma 4 target whose width shows the bf16 rounding of the embedding scale."""
    return write_gemma4(tmp_path_factory.mktemp("gemma4-wide") / "g4.gguf", GEMMA4_WIDE, seed=0)


@pytest.fixture(scope="session")
def gemma_path():
    from specgguf.runtime.defaults import default_target

    return default_target()


@pytest.fixture(scope="session")
def chat_model_path():
    """The default chat model: SmolLM2-135M-Instruct Q4_1 (a real instruct model, ChatML)."""
    from specgguf.runtime.defaults import default_chat_target

    return default_chat_target()


@pytest.fixture(scope="session")
def gemma_draft_path():
    from specgguf.runtime.defaults import requantized_default

    return requantized_default("q3_k_s")


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


@pytest.fixture(scope="session")
def qwen3_target(synth_dir):
    return write_qwen3(synth_dir / "qwen3-target.gguf", QwenShape(), seed=0)


@pytest.fixture(scope="session")
def qwen3_draft(synth_dir):
    """Same tokenizer, weights perturbed by 10%: agrees with the target often, not always."""
    return write_qwen3(synth_dir / "qwen3-draft.gguf", QwenShape(), seed=0, perturb=0.1)


@pytest.fixture(scope="session")
def counting_target(synth_dir):
    """A target that counts through its vocabulary (specgguf.synthetic): drafts that know the
    rule are accepted, so rollback and boundary bookkeeping really get exercised."""
    return write_qwen3(synth_dir / "qwen3-counting.gguf", QwenShape(), seed=0, counting=True)


# Hybrid targets (tests/test_hybrid.py, tests/test_parity.py): counting lfm2 and qwen35 models
# whose layers tip a near-tie or two, and quantised variants whose layers weigh more (they tip
# near-ties the target does not: some 5 of 60 tokens for lfm2, 10 for qwen35, whose counting
# head is harder to tip) as recurrent `model` drafts. Their embeddings are the seed's first
# draw, as qwen3's: the counting eagle3/dspark drafts of `hidden_drafts` know their rule too.
HYBRID_DRAFT_MIX = {"lfm2": 0.5, "qwen35": 1.0}


def write_hybrid(arch: str, path, **kw):
    from specgguf.synthetic.lfm2 import write_lfm2
    from specgguf.synthetic.qwen35 import write_qwen35

    return (write_lfm2 if arch == "lfm2" else write_qwen35)(path, seed=0, **kw)


@pytest.fixture(scope="session")
def lfm2_target(synth_dir):
    return write_hybrid("lfm2", synth_dir / "lfm2-counting.gguf", counting=True, mix=0.2)


@pytest.fixture(scope="session")
def qwen35_target(synth_dir):
    return write_hybrid("qwen35", synth_dir / "qwen35-counting.gguf", counting=True, mix=0.2)


@pytest.fixture(scope="session")
def qwen35_mtp_target(synth_dir):
    """A counting qwen35 target with its own MTP block (which predicts the successor); its layers
    weigh more, so the target tips near-ties the block does not: partial acceptance."""
    return write_hybrid("qwen35", synth_dir / "qwen35-mtp.gguf", counting=True, mix=1.0, mtp_layers=1)


@pytest.fixture(scope="session")
def lfm2_draft(synth_dir):
    return write_hybrid("lfm2", synth_dir / "lfm2-draft.gguf", counting=True, quant="Q8_0",
                        mix=HYBRID_DRAFT_MIX["lfm2"])


@pytest.fixture(scope="session")
def qwen35_draft(synth_dir):
    return write_hybrid("qwen35", synth_dir / "qwen35-draft.gguf", counting=True, quant="Q8_0",
                        mix=HYBRID_DRAFT_MIX["qwen35"])


@pytest.fixture(scope="session")
def hidden_drafts(synth_dir):
    """Synthetic eagle3/dflash/dspark drafts for the synthetic qwen3 targets, by name."""
    from specgguf.synthetic.qwen3 import write_dflash, write_eagle3

    d = synth_dir
    return {
        "eagle3": write_eagle3(d / "eagle3.gguf"),
        "eagle3-shared": write_eagle3(d / "eagle3-shared.gguf", own_head=False),
        "eagle3-counting": write_eagle3(d / "eagle3-counting.gguf", counting_target_seed=0),
        "dflash": write_dflash(d / "dflash.gguf"),
        "dflash-shared": write_dflash(d / "dflash-shared.gguf", own_head=False),
        "dspark-counting": write_dflash(d / "dspark-counting.gguf", markov=True, confidence=True, counting=True),
        "dspark-counting-shared": write_dflash(d / "dspark-counting-shared.gguf", markov=True, confidence=True,
                                               counting=True, own_head=False),
    }


def run_cli(*args, timeout=300, env=None):
    """Run `python -m specgguf` in a subprocess (as a user would) and capture the result."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "specgguf", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env)
