from pathlib import Path

from setuptools import find_packages, setup


def requirements(name):
    lines = Path(__file__).with_name(name).read_text().splitlines()
    return [l.strip() for l in lines if l.strip() and not l.startswith("#")]


setup(
    name="skilljax",
    version="0.1.0",
    description="JAX/Flax reinforcement learning for LLM agents with skills (SKILL0, SkillForge, ReuseRL, SAGE).",
    packages=find_packages(include=["skilljax", "skilljax.*"]),
    package_data={"skilljax": ["data/**/*"]},
    python_requires=">=3.10",
    install_requires=requirements("requirements.txt"),
    extras_require={"test": requirements("requirements-test.txt"),
                    "envs": requirements("requirements-envs.txt"),
                    # accelerators: JAX's CUDA 12 plugin, or libtpu, at the same JAX range
                    "cuda12": ["jax[cuda12]>=0.10.0,<0.11"],
                    "tpu": ["jax[tpu]>=0.10.0,<0.11"],
                    "wandb": ["wandb>=0.19"]},  # metrics.wandb_project
)
