"""Installs t2t_jax: pip install -e ".[test]"."""

from setuptools import find_packages, setup

setup(
    name="t2t_jax",
    version="0.1.0",
    description="The Transformer of 'Attention Is All You Need' in JAX/Flax, faithful to the paper.",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(include=["t2t_jax", "t2t_jax.*"]),
    install_requires=[
        # The floor is what CI's first leg runs (Python 3.11, where JAX stops at 0.10.2); its
        # second leg runs the newest JAX on the newest Python (.ci/run).
        "jax>=0.10.2",
        "flax>=0.10",
        "optax>=0.2.3",
        "orbax-checkpoint>=0.6",
        "sentencepiece>=0.2",
        "sacrebleu>=2.4",
        "sacremoses>=0.1",
        "absl-py>=2.0",
        "tensorboard>=2.16",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        "numpy>=1.26",
        "safetensors>=0.4",  # --mode=export writes model.safetensors (small; no torch needed)
    ],
    # Other packages add named experiments under the entry point group "t2t_jax.experiments"
    # (t2t_jax/registry.py); this one's are in t2t_jax/configs/.
    extras_require={
        # The suite runs on 2 workers (-n 2); NLTK's Treebank tokenizer and tree reader are
        # the independent references for a parser's tokens and trees.
        "test": ["pytest>=8", "pytest-xdist>=3", "nltk>=3.8"],
        # JAX's own accelerator extras: the CUDA 12 or 13 wheels (NVIDIA driver >= 525 / 580),
        # or libtpu on a Cloud TPU VM.
        "cuda12": ["jax[cuda12]>=0.10.2"],
        "cuda13": ["jax[cuda13]>=0.10.2"],
        "tpu": ["jax[tpu]>=0.10.2"],
        # The export checks, the CPU deployment benchmark and the hf: source: transformers
        # loads the export, CTranslate2 converts it. torch from PyPI is a CUDA build of several
        # GB; on a CPU-only machine install the CPU build first (the README says how).
        "hf": ["transformers>=4.46", "torch>=2.1", "ctranslate2>=4.0", "datasets>=2.16"],
        # The tfds: source (tensorflow-datasets' WMT14 builders). TensorFlow is 1.3 GB, and
        # nothing else needs it.
        # gs:// workdirs and data: gcsfs, through etils.epath (orbax's own file access).
        "gcs": ["gcsfs>=2024.2"],
        "tfds": ["tensorflow-cpu>=2.16", "tensorflow-datasets>=4.9.6",
                 "importlib_resources>=6"],  # tfds 4.9 imports it without declaring it
    },
)
