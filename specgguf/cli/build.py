"""`specgguf build-llama`: llama-cpp-python built for this machine (specgguf.runtime.building)."""

from __future__ import annotations

import os

import click

from ..errors import UserError


@click.command("build-llama")
@click.option("--patched", is_flag=True,
              help="Apply specgguf's llama.cpp patches (needed only by DeepSpec Eagle3 drafts).")
@click.option("--cuda", is_flag=True,
              help="Build for NVIDIA GPUs (CUDA toolkit needed; cuBLAS from it or from PyPI's nvidia-cublas).")
@click.option("--cuda-arch", default=None, metavar="ARCH",
              help="The GPU architecture to compile for, e.g. 89 (RTX 4090), 86 (RTX 30xx), 120 (RTX 50xx), or "
                   "a list: 86;89. Default: the visible GPU's (needed where no GPU is visible).")
@click.option("--metal", is_flag=True, help="Build for Apple Silicon GPUs.")
@click.option("--vulkan", is_flag=True,
              help="Build for AMD, Intel and other GPUs through Vulkan (needs the Vulkan headers, glslc and "
                   "SPIRV-Headers: apt install libvulkan-dev glslc spirv-headers).")
@click.option("--cpu", is_flag=True, help="Build for the CPU alone.")
@click.option("--rpc", is_flag=True, help="Add llama.cpp's RPC backend (for --rpc HOST:PORT).")
@click.option("--sdist", type=click.Path(dir_okay=False), default=None,
              help="A downloaded llama_cpp_python sdist (.tar.gz) instead of downloading it.")
@click.option("--rebuild", is_flag=True, help="Compile again even if this build is cached.")
@click.option("--no-install", is_flag=True, help="Build (or find) the wheel and print its path; install nothing.")
def build_llama(patched, cuda, cuda_arch, metal, vulkan, cpu, rpc, sdist, rebuild, no_install):
    """Build llama-cpp-python for this machine and install it into this environment.

    One llama.cpp compile (minutes); the wheel is cached in ~/.cache/specgguf/wheels/, so the
    same build installs again in seconds. Without a backend flag llama.cpp picks its default
    (Metal on Apple Silicon, else the CPU). $CMAKE_ARGS is passed on as well. A Vulkan build runs
    on any GPU with a Vulkan driver (and on Mesa's lavapipe, a CPU device that llama.cpp uses only
    when GGML_VK_VISIBLE_DEVICES names it). A CUDA build needs no GPU where --cuda-arch names
    the one the wheel is for.
    """
    from ..runtime import building

    chosen = [name for name, on in (("cuda", cuda), ("metal", metal), ("vulkan", vulkan), ("cpu", cpu)) if on]
    if len(chosen) > 1:
        raise UserError(f"--{' and --'.join(chosen)} exclude each other: pick one backend")
    backend = chosen[0] if chosen else None
    plan = building.Plan(patched=patched, backend=backend, rpc=rpc, extra_cmake_args=os.environ.get("CMAKE_ARGS", ""),
                         cuda_arch=cuda_arch)
    say = lambda text: click.echo(text, err=True)  # noqa: E731  (progress on stderr; the wheel path on stdout)
    wheel = building.build(plan, rebuild=rebuild, sdist=sdist, log=say)
    if no_install:
        click.echo(str(wheel))
        return
    building.install(wheel, log=say)
