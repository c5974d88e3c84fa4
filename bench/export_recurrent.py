#!/usr/bin/python3
"""A recurrent bench model: Fashion-MNIST images read row by row by a two-layer LSTM, its last hidden
state through a Linear head (the form of a speech or text encoder: recurrent layers, then MatMuls).

Trained briefly (one epoch by default) so quality figures mean something; exported by PyTorch's
exporter at opset 17 with a dynamic batch, input [N, 1, 28, 28] like the fixtures, so every bench
that feeds Fashion-MNIST images feeds it too. Next to OUT.onnx it writes OUT.input.npy (2 test
images) and OUT.logits.npy (PyTorch's output for them).

  /usr/bin/python3 bench/export_recurrent.py OUT.onnx [--hidden 128] [--epochs 1]

Then, e.g.: bench/dynamic_vs_ort.sh --model-files OUT.onnx (our dynamic mode against ONNX
Runtime's quantize_dynamic form, which turns the LSTMs into com.microsoft DynamicQuantizeLSTM).
"""
import argparse
import importlib.util
import os
import sys

import numpy as np
import onnx
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fixtures_module():
    """The fixture script's data loading and training loop (one place for both)."""
    spec = importlib.util.spec_from_file_location("make_fixtures", os.path.join(ROOT, "tests/fixtures/make_fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RowLstm(torch.nn.Module):
    def __init__(self, hidden, layers=2, num_classes=10):
        super().__init__()
        self.lstm = torch.nn.LSTM(28, hidden, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, num_classes)

    def forward(self, x):
        rows = x.flatten(1, 2)  # [N, 1, 28, 28] -> [N, 28 rows, 28 pixels]
        out, _ = self.lstm(rows)
        return self.head(out[:, -1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    fx = fixtures_module()
    fx.seed_everything(a.seed)
    torch.set_num_threads(os.cpu_count() or 1)
    x_train, y_train = (torch.from_numpy(v) for v in fx.load_split(fx.DATA_DIR, "train"))
    x_test, y_test = (torch.from_numpy(v) for v in fx.load_split(fx.DATA_DIR, "t10k"))
    model = RowLstm(a.hidden)
    fx.train(model, x_train, y_train, a.epochs, 3e-3, a.seed, lambda m: print(m, file=sys.stderr))
    accuracy = (fx.predict(model, x_test).argmax(1) == y_test).float().mean().item()
    print("test top1 %.4f" % accuracy, file=sys.stderr)
    sample = x_test[:2]
    torch.onnx.export(model, sample, a.out, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                      do_constant_folding=True)
    onnx.checker.check_model(onnx.load(a.out))
    stem = os.path.splitext(a.out)[0]
    np.save(stem + ".input.npy", sample.numpy())
    np.save(stem + ".logits.npy", fx.predict(model, sample).numpy())
    print("%s: %s" % (a.out, sorted({n.op_type for n in onnx.load(a.out).graph.node})))


if __name__ == "__main__":
    main()
