"""Shared data for the Python package tests: a fixture model, the first Fashion-MNIST test images as
numpy arrays and as the CLI's npy:DIR, and the CLI itself (ctest passes SLIMQUANT_CLI and
SLIMQUANT_SOURCE_DIR; run by hand, the defaults assume the build folder is ./build)."""
import gzip
import os
import pathlib
import subprocess

import numpy as np
import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("SLIMQUANT_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
CLI = os.environ.get("SLIMQUANT_CLI", str(SOURCE_DIR / "build" / "slimquant"))
MODELS = SOURCE_DIR / "tests" / "fixtures" / "models"
FASHION_MNIST = pathlib.Path(os.environ.get("SLIMQUANT_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))

SAMPLES = 256  # enough for top-1 to tell the layers apart, small enough for ~20 models in seconds
BATCH_SIZE = 32
BATCH_NUMS = 4


def read_idx(path, count):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    return values.reshape(dims)[:count]


@pytest.fixture(scope="session")
def fashion():
    """(images [N,1,28,28] float32 pixel/255, labels [N] int64): the fixtures' preprocessing."""
    images = read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz", SAMPLES).astype(np.float32) / 255.0
    labels = read_idx(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz", SAMPLES).astype(np.int64)
    return images.reshape(-1, 1, 28, 28), labels


@pytest.fixture(scope="session")
def npy_dir(tmp_path_factory, fashion):
    """The same samples as the CLI's npy:DIR data set."""
    d = tmp_path_factory.mktemp("npy_data")
    np.save(d / "images.npy", fashion[0])
    np.save(d / "labels.npy", fashion[1])
    return d


@pytest.fixture(scope="session")
def model_path():
    return str(MODELS / "resnet_small.onnx")


def run_cli(*args):
    """Runs build/slimquant; returns its stdout (fails the test with its stderr otherwise)."""
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"slimquant {' '.join(map(str, args))} exited {r.returncode}: {r.stderr}"
    return r.stdout


def top1_eval(images, labels, batch_size=64):
    """An eval_function as a user writes one: top-1 of the session's first output on the data."""
    def eval_function(session):
        correct = 0
        for start in range(0, len(images), batch_size):
            logits = next(iter(session.run({"input": images[start:start + batch_size]}).values()))
            correct += int((logits.argmax(axis=1) == labels[start:start + batch_size]).sum())
        return correct / len(images)
    return eval_function


def batches(images, labels, batch_size=BATCH_SIZE):
    """A data_loader: (batch, labels) tuples, as a paddle DataLoader yields them."""
    return [(images[i:i + batch_size], labels[i:i + batch_size]) for i in range(0, len(images), batch_size)]


@pytest.fixture(scope="session")
def cli_analysis(tmp_path_factory, model_path, npy_dir):
    """`slimquant analyze` with top-1 on the samples: the ranking the Python analyses must equal."""
    save_dir = tmp_path_factory.mktemp("cli_analysis")
    run_cli("analyze", model_path, f"npy:{npy_dir}", "--metric", "top1", "--algo", "KL", "--batch-size", BATCH_SIZE,
            "--batch-nums", BATCH_NUMS, "--num-histogram-plots", "0", "--save-dir", save_dir)
    return save_dir
